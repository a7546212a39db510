"""The learning rate x per-worker batch study: its cells, its command (found by the studies'
registry: no other file names it), and one tiny grid trained and summarised through it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from guide_utils.core.errors import GuideError
from guide_utils.studies import lr_batch, registry

CLI = [sys.executable, "-m", "guide_utils", "lr-batch"]
TINY = dict(mnist1d_samples=2000, epochs=2, milestones=(1,))


def test_the_cells_cover_the_grid_and_the_baseline():
    pts = lr_batch.points()
    assert len(pts) == len(lr_batch.BATCHES) * len(lr_batch.FACTORS) * len(lr_batch.SEEDS)
    # the baseline cell (batch 32 at the rule's rate) is trained whatever the grid
    assert lr_batch.points([128], [0.5], [0]) == [lr_batch.Point(32, 1.0, 0), lr_batch.Point(128, 0.5, 0)]
    cfg = lr_batch.Point(512, 0.25, 1).config()
    assert (cfg.per_worker_batch, cfg.base_lr, cfg.base_batch, cfg.lr_scaling, cfg.warmup) == \
        (512, 0.0125, 32, "linear", "none")
    assert cfg.extra == {"lr_batch": {"per_worker_batch": 512, "lr_factor": 0.25, "seed": 1}}
    with pytest.raises(GuideError, match="--factors more than 0"):
        lr_batch.points([32], [0.0])


def test_it_is_a_registered_study_and_its_dry_run_lists_the_runs():
    assert registry.studies()["lr-batch"] is lr_batch.STUDY
    proc = subprocess.run([*CLI, "run", "--dry-run", "--batches", "64", "--factors", "0.5", "2", "--seeds", "0", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "MNIST-1D learning rate x per-worker batch: 6 point(s) x 1 thread count(s) (1) = 6 run(s)"
    assert lines[1:3] == ["  per_worker_batch=32 lr_factor=1.0 seed=0", "  per_worker_batch=32 lr_factor=1.0 seed=1"]
    assert "  per_worker_batch=64 lr_factor=2.0 seed=1" in lines
    bad = subprocess.run([*CLI, "run", "--factors", "-1"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--factors" in bad.stderr


def _tiny(argv: list[str]) -> subprocess.CompletedProcess:
    """The study's command in a fresh interpreter (its worker pool ends with it), the problem shrunk."""
    code = ("import sys; from guide_utils.studies import lr_batch; "
            f"sys.exit(lr_batch.STUDY.main({argv!r}, overrides={TINY!r}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_a_tiny_grid_trains_into_its_csv_and_summarises(tmp_path):
    """The command as a user runs it (a CSV, a spawned worker at one thread), on a problem small
    enough for a test: the baseline cell and one more, then the summary against the baseline."""
    out = tmp_path / "grid.csv"
    argv = ["run", "--batches", "64", "--factors", "2", "--seeds", "0", "--threads", "1", "--out", str(out),
            "--results-dir", str(tmp_path / "r")]
    proc = _tiny(argv)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = lr_batch.STUDY.load(out)
    assert table.attrs["source"].startswith("MNIST-1D learning rate x per-worker batch (python -m guide_utils "
                                            "lr-batch run --batches 64")
    cells = table.set_index(["per_worker_batch", "lr_factor"])
    assert sorted(cells.index) == [(32, 1.0), (64, 2.0)] and set(table["threads"]) == {1}
    assert cells.loc[(64, 2.0), "peak_lr"] == pytest.approx(0.05 * 2 * 64 / 32)
    assert len(list((tmp_path / "r").glob("*.jsonl"))) == 2
    shown = proc.stdout
    assert "per_worker_batch=64   lr_factor=2.0   median" in shown and "near the baseline" in shown
    best = lr_batch.best_factors(lr_batch.STUDY.outcomes(table))
    assert set(best) == {32, 64} and f"lowest median per batch: 32: x1 (lr 0.05), 64: x{best[64]:g}" in shown
    again = _tiny(argv)  # never overwritten: --resume or another --out
    assert again.returncode == 2 and "already exists" in again.stderr and "Traceback" not in again.stderr
