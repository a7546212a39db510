"""guide_utils.core.scaling against the thesis's numbers (seed 001)."""

import pytest

from guide_utils.core.scaling import efficiency, global_batch, scaled_lr, speedup

# Learning rates the thesis used, from base lr 0.1 at batch 256 (Appendices 7, 9, 11, 13, 15).
# Appendix 9 prints 1.4 for 24 GPUs: a typo, since 24 x 128 / 256 x 0.1 = 1.2, which is what
# Appendices 13 and 15 list for the same 24-GPU setting.
THESIS_LRS = [
    (128, 1, 0.05), (128, 8, 0.4), (128, 16, 0.8), (128, 24, 1.2), (128, 32, 1.6),
    (32, 32, 0.4),  # experiment 7: reduced per-worker batch
]


@pytest.mark.parametrize("per_worker, workers, lr", THESIS_LRS)
def test_linear_rule_gives_the_thesis_learning_rates(per_worker, workers, lr):
    assert scaled_lr(0.1, 256, global_batch(per_worker, workers)) == lr


def test_other_rules():
    assert scaled_lr(0.1, 256, 4096, rule="none") == 0.1  # experiment 4, naive scaling
    assert scaled_lr(0.1, 256, 4096, rule="sqrt") == pytest.approx(0.4)
    assert scaled_lr(0.1, 256, 64, rule="sqrt") == pytest.approx(0.05)


# (throughput on N GPUs, 1-GPU baseline, N, speedup the thesis reports)
THESIS_SPEEDUPS = [
    (6104.32, 207.79, 32, 29.4),  # Horovod+PyTorch, tables 3 and 9
    (5696.80, 207.11, 32, 27.5),  # PyTorch, tables 2 and 8
    (4767.74, 210.15, 32, 22.7),  # Horovod+TF, batch 32, tables 1 and 7
    (6210.30, 234.01, 32, 26.5),  # batch 64
    (6643.48, 249.28, 32, 26.7),  # batch 128
]


@pytest.mark.parametrize("rate, base, n, reported", THESIS_SPEEDUPS)
def test_speedups_match_the_thesis(rate, base, n, reported):
    assert round(speedup(rate, base), 1) == reported
    assert efficiency(rate, base, n) == pytest.approx(reported / n, abs=0.002)


def test_efficiency_of_the_best_thesis_run():
    assert efficiency(6104.32, 207.79, 32) == pytest.approx(0.918, abs=0.001)


@pytest.mark.parametrize("call, name", [
    (lambda: global_batch(0, 4), "per_worker_batch"),
    (lambda: global_batch(128, -1), "workers"),
    (lambda: global_batch(1.5, 2), "per_worker_batch"),
    (lambda: scaled_lr(0.1, 256, 512, rule="cubic"), "rule"),
    (lambda: scaled_lr(0, 256, 512), "base_lr"),
    (lambda: scaled_lr(0.1, 0, 512), "base_batch"),
    (lambda: scaled_lr(0.1, 256, 0), "global_batch"),
    (lambda: speedup(100, 0), "baseline_throughput"),
    (lambda: efficiency(100, 50, 0), "workers"),
])
def test_bad_arguments_name_themselves(call, name):
    with pytest.raises(ValueError, match=name):
        call()
