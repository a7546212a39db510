"""The thesis's throughput formula and the meter, on an injected clock (exact, not timed)."""

import pytest

from guide_utils.core.throughput import ThroughputMeter, images_per_second


def test_formula_on_thesis_tables():
    # Table 9: 32 GPUs x 128 at 6104.32 img/s means a mean batch time of 4096/6104.32 s
    assert images_per_second(128, 32, 4096 / 6104.32) == pytest.approx(6104.32)
    assert images_per_second(128, 1, 0.633) == pytest.approx(202.21, abs=0.005)


@pytest.mark.parametrize("args, name", [((0, 1, 1.0), "per_worker_batch"), ((8, 0, 1.0), "workers"),
                                        ((8, 1, 0.0), "mean_batch_time")])
def test_formula_rejects_bad_input(args, name):
    with pytest.raises(ValueError, match=name):
        images_per_second(*args)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_meter_drops_warmup_iterations():
    clock = Clock()
    m = ThroughputMeter(32, workers=4, warmup_iters=2, clock=clock)
    m.step()  # start
    for dt in (5.0, 3.0, 0.5, 0.5, 0.5, 0.5):  # two slow warm-up iterations, then steady
        clock.t += dt
        m.step()
    assert m.measured_iters == 4
    assert m.mean_batch_time == pytest.approx(0.5)
    assert m.images_per_second() == pytest.approx(32 * 4 / 0.5)
    assert m.images_per_second_per_worker() == pytest.approx(64)


def test_meter_splits_data_and_compute_time():
    clock = Clock()
    m = ThroughputMeter(8, warmup_iters=0, clock=clock)
    m.step()
    for _ in range(3):
        clock.t += 0.1
        m.mark_data_ready()  # 0.1 s waiting for the batch
        clock.t += 0.3
        m.step()
    s = m.summary()
    assert s["data_fraction"] == pytest.approx(0.25)
    assert s["images_per_second"] == pytest.approx(20) and s["measured_iters"] == 3 and s["warmup_iters"] == 0


def test_meter_without_measured_iterations_says_why():
    m = ThroughputMeter(8, warmup_iters=5, clock=Clock())
    m.step()
    m.step()
    with pytest.raises(RuntimeError, match="warm-up"):
        m.images_per_second()
