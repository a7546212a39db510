"""The quality sweep: its points, its CLI, the recorded results the book shows, and that the
recorded numbers are what this code produces."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from guide_utils.studies import study, sweep
from guide_utils.core.errors import GuideError

CLI = [sys.executable, "-m", "guide_utils", "sweep"]
REPO = Path(__file__).resolve().parents[1]


def test_points_cover_every_k_method_and_seed_plus_the_baseline():
    pts = sweep.points()
    assert len(pts) == 5 + 4 * 3 * 5 and sweep.THREADS == (1, 2)
    assert {p.method for p in pts if p.k == 1} == {"baseline"}
    warm = sweep.Point(32, "linear+warmup", 0).settings()
    assert (warm["per_worker_batch"], warm["lr_scaling"], warm["warmup"], warm["warmup_epochs"]) == \
        (1024, "linear", "gradual", 5)
    assert sweep.Point(8, "naive", 1).settings()["lr_scaling"] == "none"
    assert sweep.Point(1, "baseline", 2).settings()["per_worker_batch"] == 32


@pytest.mark.parametrize("kwargs", [{"methods": ["cosine"]}, {"ks": [1, 4]}])
def test_bad_points_are_refused(kwargs):
    with pytest.raises(GuideError):
        sweep.points(**kwargs)


def test_recorded_sweep_is_complete_and_labelled():
    table = sweep.recorded()
    source = table.attrs["source"]
    assert re.search(r"commit [0-9a-f]{12};", source), "the recording must name a clean commit"
    for needle in ("measured 20", "cores", "1 and 2 thread(s) per run", "AVX", "torch 2.14.1",
                   "sweep run --jobs 2 --out src/guide_utils/results/recorded/quality_sweep_mnist1d.csv"):
        assert needle in source
    got = sorted((r.k, r.method, r.seed, r.threads) for r in table.itertuples())
    assert got == sorted((p.k, p.method, p.seed, t) for p in sweep.points() for t in sweep.THREADS)
    assert (table["peak_lr"][table["method"] == "naive"] == 0.05).all()
    assert (table.query("method == 'linear'")["peak_lr"] == 0.05 * table.query("method == 'linear'")["k"]).all()


def test_recorded_sweep_shows_what_the_book_says():
    """Chapters 4-7 describe these distributions in words; if the sweep is rerun and they
    change, this fails and the text must be rewritten to match (never the other way round).
    Only what ten runs per point (five seeds at one and at two threads) show is asserted;
    "near the baseline" is at most half above its median error (``study.TOLERANCE``)."""
    table = sweep.recorded()
    out = sweep.outcomes(table).set_index(["method", "k"])
    base = out.loc[("baseline", 1)]
    runs = {(m, k): table.query("method == @m and k == @k")["best_val_top1_err"] for m, k in out.index}
    naive, linear, warm = (out.loc[m] for m in ("naive", "linear", "linear+warmup"))
    assert (out["runs"] == 10).all()
    # chapter 4: naive loses accuracy as k grows; fewer runs near the baseline at each k, none at 32
    assert naive["median"].is_monotonic_increasing and naive["within"].is_monotonic_decreasing
    assert list(naive["within"]) == [9, 6, 2, 0] and naive.loc[32, "median"] > base["worst"]
    # chapter 5: the rule alone is no better than naive up to k = 8, worse at 16, and at 32
    # every run ends far behind every naive run
    assert list(linear["within"]) == [9, 8, 0, 0]
    assert (abs(linear.loc[[4, 8], "median"] - naive.loc[[4, 8], "median"]) < 0.1).all()
    assert linear.loc[16, "median"] > naive.loc[16, "median"] and linear.loc[16, "within"] < naive.loc[16, "within"]
    assert runs[("linear", 32)].min() > 3 * runs[("naive", 32)].max()
    # chapter 6: with warmup the median stays inside the baseline's runs up to k = 16; at 32 it
    # has the lowest median of the three, but no run near the baseline, and one seed diverged
    # at both thread counts
    assert (warm.loc[[4, 8, 16], "median"] <= base["worst"]).all() and list(warm["within"]) == [10, 9, 7, 0]
    assert out.xs(32, level="k")["median"].idxmin() == "linear+warmup"
    assert warm.loc[32, "median"] > base["worst"]
    diverged = table.query("k == 32 and method == 'linear+warmup' and best_val_top1_err > 5")
    assert list(diverged["seed"].unique()) == [3] and sorted(diverged["threads"]) == [1, 2]
    # chapter 7: at the same settings k = 8 beats k = 32 in every pair of runs
    assert runs[("linear+warmup", 8)].max() < runs[("linear+warmup", 32)].min()


def test_the_tolerance_is_as_wide_as_the_baselines_own_spread_as_the_methods_page_says():
    """book/methods.md justifies "near the baseline" (half above its median) by the recorded
    baseline runs: all of them inside, the worst at 1.49 x the median; a quarter would leave
    four of ten baseline runs outside. Its numbers are read back here."""
    table = sweep.recorded()
    base = table.query("method == 'baseline'")["best_val_top1_err"]
    ratio = base.max() / base.median()
    assert study.TOLERANCE == 0.5 and 1 + study.TOLERANCE >= ratio > 1 + study.TOLERANCE - 0.05
    outside_at_quarter = int((base > 1.25 * base.median()).sum())
    text = " ".join((REPO / "book" / "methods.md").read_text().split())
    for said in (f"median of {base.median():.2f} %", f"{base.min():.2f} to {base.max():.2f} %",
                 f"{ratio:.2f} times", f"at most {1.5 * base.median():.2f} %",
                 f"{outside_at_quarter} of the {len(base)} baseline runs"):
        assert said in text, f"book/methods.md no longer says {said!r}"


@pytest.mark.parametrize("method", ["linear", "linear+warmup"])
def test_the_recorded_curves_are_the_sweeps_runs(method):
    """Chapters 5 and 6 show the k = 32 runs with and without warmup epoch by epoch: their
    records must end exactly where the recorded sweep says those runs ended, seed by seed
    and thread count."""
    table = sweep.recorded().set_index(["k", "method", "seed", "threads"])
    curves = sweep.recorded_curves(method, 32)
    assert [(r.config["seed"], r.environment["cpu_threads"]) for r in curves] == \
        [(s, t) for s in sweep.SEEDS for t in sweep.THREADS]
    for r in curves:
        row = table.loc[(32, method, r.config["seed"], r.environment["cpu_threads"])]
        errs = r.epochs["val_top1_err"]
        assert len(errs) == r.config["epochs"] == sweep.SETTINGS["epochs"]
        assert round(errs.min(), 3) == row["best_val_top1_err"] and round(errs.iloc[-1], 3) == row["final_val_top1_err"]
        assert r.config["peak_lr"] == row["peak_lr"] and r.config["global_batch"] == row["global_batch"]
    with pytest.raises(GuideError, match="no recorded curves"):
        sweep.recorded_curves("naive", 4)


def _tiny(args: list[str]) -> list[str]:
    # A tiny problem through the same command: the engine's own flags are not exposed, so the
    # run's overrides (which travel to the spawned workers with each run) are set on ``run``.
    return [sys.executable, "-c", "import functools, sys; from guide_utils.studies import sweep; "
            "sweep.run = functools.partial(sweep.run, overrides=dict(mnist1d_samples=2000, epochs=2, "
            f"milestones=(1,))); sys.exit(sweep.main({args!r}))"]


def test_cli_writes_a_sweep_csv_refuses_to_overwrite_and_resumes(tmp_path):
    out = tmp_path / "s.csv"
    args = ["run", "--ks", "32", "--seeds", "0", "--methods", "naive", "--results-dir", str(tmp_path / "r"),
            "--out", str(out), "--threads", "1"]
    proc = subprocess.run(_tiny(args), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = sweep.load(out)
    assert sorted(table["method"]) == ["baseline", "naive"] and set(table["threads"]) == {1}
    assert len(list((tmp_path / "r").glob("*.jsonl"))) == 2
    assert "median" in proc.stdout and "worst" in proc.stdout
    before = out.read_bytes()
    again = subprocess.run(_tiny(args), capture_output=True, text=True, timeout=600)
    assert again.returncode == 2 and "already exists" in again.stderr and "Traceback" not in again.stderr
    assert out.read_bytes() == before
    # --resume at 1 and 2 threads trains only the two runs at 2 threads and keeps the others
    more = subprocess.run(_tiny([*args[:-1], "1", "2", "--resume"]), capture_output=True, text=True, timeout=600)
    assert more.returncode == 0, more.stderr[-2000:]
    table = sweep.load(out)
    assert out.read_bytes().startswith(before) and len(table) == 4
    assert sorted(table["threads"]) == [1, 1, 2, 2]


def test_malformed_csv_is_one_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("# something else\na,b\n1,2\n")
    proc = subprocess.run([*CLI, "summary", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2 and "lacks column" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = subprocess.run([*CLI, "summary", str(tmp_path / "missing.csv")], capture_output=True, text=True)
    assert proc.returncode == 2 and "no sweep results" in proc.stderr


# One recorded point (k = 32, linear + warmup, seed 0) is retrained by chapter 6 itself, which
# asserts it lands within 0.5 points of the recording; the book build runs it once per session.


def test_the_methods_pages_step_counts_are_the_engines():
    """book/methods.md once said 625 steps per epoch for the baseline (20,000 / 32, the whole
    set) where the engine trains 16,000 samples: 500. Both counts it states come from the plan."""
    from mnist1d.data import get_dataset_args

    from guide_utils.engine.plan import RunPlan

    train = int(sweep.SETTINGS["mnist1d_samples"] * get_dataset_args().train_split)
    steps = {k: RunPlan.make(sweep.Point(k, "linear", 0).config(), workers=1, samples_per_worker=train).steps_per_epoch
             for k in (1, 32)}
    assert train == 16000 and steps == {1: 500, 32: 15}
    assert sweep.recorded_curves("linear", 32)[0].config["steps_per_epoch"] == steps[32]
    text = " ".join((REPO / "book" / "methods.md").read_text().split())
    assert f"{train:,} training samples give that batch {steps[32]} steps per epoch" in text
    assert f"{steps[1]} steps per epoch: {train:,} training samples in batches of 32" in text
    assert "625" not in text
