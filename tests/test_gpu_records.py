"""The recorded GPU figures: every number is the one its quoted log line states, and the
record of a GPU check is written from run_h100.sh's outputs."""

import json
import statistics

import pytest

from guide_utils.perf import gpu_records, record, spread


def _stated(value: float, text: str) -> bool:
    return f"{value:.1f}" in text or f"{value:.0f} img/s" in text


def test_every_h100_figure_is_the_number_its_log_line_states():
    meta, rows = record.read(gpu_records.BEFORE)
    assert meta["commit"] == "22a266a" and meta["date"] == "2026-11-27" and "H100" in meta["hardware"]
    assert len(rows) == 13
    for r in rows:
        quoted = " ".join(s["text"] for s in r["source"])
        runs = r["images_per_second_runs"]
        assert _stated(statistics.median(runs), quoted) or all(_stated(v, quoted) for v in runs), r["id"]


def test_the_figures_the_chapters_cite():
    _, t = gpu_records.before()
    ips = t["images_per_second"]
    assert ips["resident_bf16_cl_b128"] == 3704.5 and ips["resident_fp32_b128"] == 1801.6
    assert round(ips["engine_bf16_cl_b128"] / ips["resident_bf16_cl_b128"], 2) == 0.69
    assert round(ips["engine_bf16_cl_b128"] / ips["hand_bf16_cl_b128"], 3) == 0.837
    run = gpu_records.compile_run()
    assert run.environment["gpu"] == "NVIDIA H100 80GB HBM3"
    assert round(run.epochs.iloc[0]["images_per_second"], 1) == ips["engine_bf16_cl_compile_b128"]


def test_a_gpu_check_becomes_a_record(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "env.txt").write_text("date: 2026-11-27T06:00:00Z\nsmoke: 0\ngpu NVIDIA H100 80GB HBM3\n")
    line = {"step": "A", "benchmark": "engine_vs_hand_loop", "data": "synthetic-loader", "amp": "bf16",
            "engine_images_per_second": [3500.0, 3600.0], "hand_images_per_second": [3600.0, 3650.0],
            "ratio": 3550 / 3625, "resident_images_per_second": [3700.0], "ratio_to_resident": 3550 / 3700}
    (out / "results.jsonl").write_text(json.dumps(line) + "\n" + json.dumps({"benchmark": "step_overhead"}) + "\n")
    dest = gpu_records.record_check(out, tmp_path / "after.jsonl", commit="abc1234")
    first, *rows = [json.loads(x) for x in dest.read_text().splitlines()]
    assert first["commit"] == "abc1234" and first["smoke"] is False and "H100" in " ".join(first["env"])
    assert rows[0] == {"kind": "benchmark", **line} and len(rows) == 2
    t = gpu_records.after_table(rows)
    assert t.loc[0, ["engine", "hand", "resident"]].tolist() == [3550.0, 3625.0, 3700.0] and len(t) == 1
    # the GPU machine's copy of the tree may carry an older .git: the commit named is kept, and
    # what that git said beside it; a matching short or long hash is left as written
    (out / "env.txt").write_text("date: 2026-11-27T06:00:00Z\nsmoke: 0\ncommit: 91cd9b4c90c3\n")
    first = json.loads((gpu_records.record_check(out, tmp_path / "a2.jsonl", commit="5e5e3ae")).read_text()
                       .splitlines()[0])
    assert first["env"][2] == "commit: 5e5e3ae (the working tree sent; the copy's own .git named 91cd9b4c90c3)"
    first = json.loads((gpu_records.record_check(out, tmp_path / "a3.jsonl", commit="91cd9b4")).read_text()
                       .splitlines()[0])
    assert first["env"][2] == "commit: 91cd9b4c90c3"
    (out / "env.txt").write_text("date: 2026-11-27T06:00:00Z\nsmoke: 1\n")
    with pytest.raises(ValueError, match="smoke run"):
        gpu_records.record_check(out, tmp_path / "smoke.jsonl", commit="abc1234")
    (out / "results.jsonl").write_text("")
    with pytest.raises(ValueError, match="no benchmark results"):
        gpu_records.record_check(out, tmp_path / "empty.jsonl", commit="abc1234")


def test_the_checks_of_the_changed_engine_in_the_order_measured():
    checks = gpu_records.afters()
    assert [meta["commit"][:7] for meta, _ in checks][:2] == ["0c1c465", "5e5e3ae"]
    assert gpu_records.after() == checks[-1]
    assert gpu_records.next_after_name() == f"gpu_h100_after_{len(checks) + 1}.jsonl"
    for meta, rows in checks:  # every check has the rows the chapters read
        steps = {r.get("step") for r in rows}
        assert {"A-bf16-loader-uint8", "C-fp32-loader-uint8", "D-step-overhead"} <= steps, meta["commit"]


def test_the_step_probe_record_before_and_after_the_metrics_change():
    probe = gpu_records.step_probe()
    assert set(probe) == {"before", "after"}
    before, after = probe["before"], probe["after"]
    # before: the engine launched 7 kernels per step more than the hand loop, top-k's occupancy
    # queries among its runtime calls; after: the loss add, and the hits of 16 steps at a time
    assert before["calls"]["engine"]["[kernels]"] - before["calls"]["hand"]["[kernels]"] == 7
    assert before["calls"]["engine"]["cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"] == 8
    extra = after["calls"]["engine"]["[kernels]"] - after["calls"]["hand"]["[kernels]"]
    assert 1 < extra < 2  # the loss's add every step, the hits' few kernels every 16th
    assert before["us"]["engine"] - before["us"]["no-metrics"] == pytest.approx(329.8)


def test_a_target_is_met_only_when_every_paired_round_clears_it():
    """The ratio of the medians can clear a target that a round missed: 3450 / 3550 = 0.972,
    while the first round's pair was 3300 / 3600 = 0.917."""
    line = {"step": "A", "benchmark": "engine_vs_hand_loop", "engine_images_per_second": [3300.0, 3600.0],
            "hand_images_per_second": [3600.0, 3500.0], "resident_images_per_second": [3700.0, 3700.0]}
    overhead = {"step": "D", "benchmark": "step_overhead", "engine_us_per_step": [800.0, 700.0, 900.0],
                "hand_us_per_step": [700.0, 690.0, 600.0], "budget_us": 150.0}
    s = gpu_records.after_spreads([line, overhead])
    ratio = s["A"]["engine/hand"]
    assert 3450 / 3550 > 0.97 and ratio.low == pytest.approx(3300 / 3600) and ratio.high == pytest.approx(3600 / 3500)
    assert spread.verdict(ratio, 0.97) == "undecided" and spread.verdict(ratio, 0.9) == "met"
    assert spread.verdict(ratio, 1.05) == "missed"
    extra = s["D"]["extra_us"]
    assert extra.values == (100.0, 10.0, 300.0) and extra.median == 100.0 and extra.count_beyond(150) == 1
    assert spread.verdict(extra, 150, at_most=True) == "undecided"
    assert spread.verdict(extra, 5, at_most=True) == "missed"
    assert s["D"]["hand_us"].low == 600.0 and s["A"]["engine/resident"].high == pytest.approx(3600 / 3700)
    with pytest.raises(ValueError, match="as many of each"):
        spread.paired([1.0, 2.0], [1.0])
    assert f"{spread.rounds([2.0]):.1f}" == "2.0 (one round)"


def test_every_recorded_gpu_session_ran_the_same_pytorch_on_an_h100():
    """The book says which PyTorch ran on the H100: not the pinned 2.14.1, in any session."""
    sessions = gpu_records.sessions()
    assert len(sessions) == 1 + len(gpu_records.afters())
    assert {s["torch"] for s in sessions} == {"2.11.0+cu130"}
    assert {s["gpu"] for s in sessions} == {"NVIDIA H100 80GB HBM3"}
    assert [s["commit"] for s in sessions][:3] == ["22a266a", "0c1c465", "5e5e3ae"]


def test_the_step_probe_keeps_every_round_and_its_medians_are_theirs():
    for section in gpu_records.step_probe().values():
        assert len(section["rounds"]) == 5
        for variant, median in section["us"].items():
            assert statistics.median(r[variant] for r in section["rounds"]) == pytest.approx(median)
