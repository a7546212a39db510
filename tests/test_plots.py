"""The figures draw what they are given: the thesis's speedups, the sweep's medians, ranges and runs."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402

from guide_utils.results import plots, sources
from guide_utils.studies import sweep  # noqa: E402


def test_scaling_panels_draw_each_curve_against_its_own_baseline():
    t = sources.thesis_throughput("horovod_pytorch").query("per_worker_batch == 128")
    speed_ax, eff_ax = plots.scaling_panels({"thesis": t})
    x, y = speed_ax.lines[0].get_data()
    assert list(x) == [1, 2, 4, 8, 16, 24, 32] and y[-1] == pytest.approx(6104.32 / 207.79)
    assert eff_ax.lines[0].get_data()[1][-1] == pytest.approx(100 * 6104.32 / 207.79 / 32)
    with pytest.raises(ValueError, match="no 1-worker row"):
        plots.scaling_panels({"no baseline": t[t["gpus"] > 1]})


def test_quality_figure_draws_medians_ranges_and_every_run():
    table = sweep.recorded()
    outcomes = sweep.outcomes(table)
    ax = plots.quality_vs_k(outcomes, table=table)
    assert ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0].startswith("baseline k=1 (median") and set(labels[1:]) == {"naive", "linear", "linear+warmup"}
    runs = len(table[table["method"] != "baseline"])
    assert sum(len(c.get_offsets()) for c in ax.collections if isinstance(c, PathCollection)) == runs  # scatter
    # each method's line goes through its medians, and its bar spans its best to worst run
    bars = {c.get_label(): c for c in ax.containers}
    linear = outcomes.query("method == 'linear'").sort_values("k")
    x, y = bars["linear"].lines[0].get_data()
    assert list(x) == list(linear["k"]) and list(y) == pytest.approx(list(linear["median"]))
    segments = bars["linear"].lines[2][0].get_segments()
    assert [v for s in segments for v in (s[0][1], s[1][1])] == pytest.approx(
        [v for pair in zip(linear["best"], linear["worst"]) for v in pair])


def test_lr_schedules_follow_lr_at():
    ax = plots.lr_schedules({"gradual": {"peak_lr": 1.6, "warmup": "gradual", "warmup_start_lr": 0.05}},
                            epochs=6, steps_per_epoch=2)
    x, y = ax.lines[0].get_data()
    assert y[0] == pytest.approx(0.05) and y[list(x).index(5.0)] == pytest.approx(1.6)


def test_throughput_axis_starts_at_zero():
    ax = plots.throughput_vs_batch(pd.DataFrame({"per_worker_batch": [32, 128], "images_per_second": [900, 1000]}),
                                   label="x")
    assert ax.get_ylim()[0] == 0


def test_utilisation_draws_one_line_per_gpu_and_refuses_a_record_without_samples(tmp_path):
    import pandas as pd

    from guide_utils.core.records import RunRecorder, read_run

    rec = RunRecorder(tmp_path, "monitored", config={"model": "m"})
    for t in (1.0, 2.0, 3.0):
        rec.sample({"t": t, "cpu_percent": 50.0, "cpu_percent_per_core": [40.0, 60.0], "process_cpu_percent": 90.0,
                    "gpus": [{"index": 0, "util_percent": 95}, {"index": 1, "util_percent": 30}]})
    axes = plots.utilisation(read_run(rec.path))
    assert len(axes[0].lines) == 2 and axes[0].lines[1].get_ydata().tolist() == [30, 30, 30]
    assert isinstance(read_run(rec.path).samples, pd.DataFrame)
    bare = RunRecorder(tmp_path, "bare", config={"model": "m"})
    with pytest.raises(ValueError, match="--monitor"):
        plots.utilisation(read_run(bare.path))
