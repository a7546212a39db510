"""Log parsing against the thesis's own log lines (Figures 11-13) and tf_cnn_benchmarks output."""

from pathlib import Path

import pytest

from guide_utils.results.logs import (LogFormatError, parse_log, parse_pytorch_log, parse_tf_cnn_benchmarks_log,
                              throughput_from_pytorch_log)

DATA = Path(__file__).parent / "data"

# Figure 11 of the thesis, verbatim (rank-prefixed, tab-separated)
FIGURE_11 = """0: Epoch: [0][197/10010]\tTime 0.581 (0.633)\tData 0.273 (0.283) ...
0: Epoch: [0][198/10010]\tTime 0.581 (0.633)\tData 0.273 (0.283) ...
0: Epoch: [0][199/10010]\tTime 0.582 (0.633)\tData 0.273 (0.283) ...
0: Epoch: [0][200/10010]\tTime 0.581 (0.632)\tData 0.273 (0.283) ...
0: Epoch: [0][201/10010]\tTime 0.581 (0.632)\tData 0.273 (0.283) ..."""


def test_thesis_figure_11():
    log = parse_pytorch_log(FIGURE_11)
    assert len(log.records) == 5 and log.skipped == 0
    rec = log.records[2]
    assert rec == {"type": "batch", "rank": 0, "epoch": 0, "batch": 199, "batches_per_epoch": 10010,
                   "time": 0.582, "time_avg": 0.633, "data": 0.273, "data_avg": 0.283}


def test_thesis_throughput_formula_on_its_own_log():
    # 128 images per GPU, 1 GPU, average batch time 0.633 s at batch 199 -> 202.21 img/s.
    # (Table 3's 207.79 img/s came from another run's log; this pins the formula.)
    assert throughput_from_pytorch_log(parse_pytorch_log(FIGURE_11), 128, 1) == pytest.approx(128 / 0.633)
    assert round(throughput_from_pytorch_log(parse_pytorch_log(FIGURE_11), 128, 1), 2) == 202.21


def test_figures_12_13_spaces_and_no_rank():
    log = parse_pytorch_log("Epoch: [0][0/5005]   Time 18.532 (18.532)  Data 12.142 (12.142) ...\n"
                            "0: Epoch: [0][0/313]   Time 21.925 (21.925)   Data 11.993 (11.993) ...")
    assert [(r["rank"], r["batches_per_epoch"], r["data"]) for r in log.records] == [(None, 5005, 12.142),
                                                                                    (0, 313, 11.993)]


def test_rank_prefixed_file_with_noise_and_a_truncated_line():
    log = parse_pytorch_log(DATA / "pytorch_examples_horovod.log")
    assert log.skipped == 1  # "0: Epoch: [0][201/1"; the NCCL line and blank line are ignored
    assert [r["rank"] for r in log.records if r["type"] == "batch"] == [0, 0, 1, 0, 0, 0]
    assert log.records[-1] == {"type": "validation", "rank": 0, "acc1": 76.13, "acc5": 92.862}
    # rank 0's line is used, not rank 1's (0.641)
    assert throughput_from_pytorch_log(log, 128, 4) == pytest.approx(4 * 128 / 0.633)


def test_loss_and_accuracy_fields():
    log = parse_pytorch_log(DATA / "pytorch_examples_full.log")
    first = log.records[0]
    assert (first["loss"], first["loss_avg"], first["acc1"], first["acc5_avg"]) == (6.9618, 6.9618, 0.0, 0.39)
    assert log.records[1]["time_avg"] == 2.181
    assert log.skipped == 1 and log.records[-1]["type"] == "validation"


def test_tf_cnn_benchmarks():
    log = parse_tf_cnn_benchmarks_log(DATA / "tf_cnn_benchmarks.log")
    assert [r["type"] for r in log.records] == ["step", "step", "step", "total"]
    assert log.records[1] == {"type": "step", "step": 10, "images_per_second": 210.3, "plus_minus": 0.5,
                              "jitter": 1.2, "loss": 7.856}
    assert log.records[-1]["images_per_second"] == 210.15  # Table 1, batch 32
    assert log.skipped == 1


def test_parse_log_detects_the_format():
    assert parse_log(DATA / "tf_cnn_benchmarks.log").kind == "tf_cnn_benchmarks"
    assert parse_log(str(DATA / "pytorch_examples_horovod.log")).kind == "pytorch"


def test_no_record_is_a_clear_error(tmp_path):
    empty = tmp_path / "slurm-123.out"
    empty.write_text("srun: error: node7: task 3: Exited with exit code 1\n")
    with pytest.raises(LogFormatError, match="slurm-123.out"):
        parse_log(empty)
    with pytest.raises(LogFormatError, match="Epoch"):
        parse_pytorch_log(empty)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="nope.log"):
        parse_log("nope.log")


def test_batch_199_missing():
    with pytest.raises(LogFormatError, match="batch 199"):
        throughput_from_pytorch_log(parse_pytorch_log("Epoch: [0][5/10]\tTime 1 (1)\tData 0 (0)"), 128, 1)
