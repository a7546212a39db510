"""The experiment catalogue: the thesis's runs at full scale, their smoke counterparts, the
dry run's commands, and a smoke experiment actually run through the engine."""

from __future__ import annotations

import subprocess
import sys

import pytest

from guide_utils.config import make_config
from guide_utils.experiments import EXPERIMENTS, plan, runs
from guide_utils.records import read_runs
from guide_utils.scaling import global_batch, scaled_lr


def _lr(run) -> float:
    cfg = make_config("full", **{k: v for k, v in run.settings.items()})
    return scaled_lr(cfg.base_lr, cfg.base_batch, global_batch(cfg.per_worker_batch, run.workers), rule=cfg.lr_scaling)


@pytest.mark.parametrize("name, expected", [
    # (GPUs, global batch, learning rate) as printed in the thesis's tables 10-15
    ("exp4", [(1, 128, 0.1), (2, 256, 0.1), (16, 2048, 0.1), (24, 3072, 0.1), (32, 4096, 0.1)]),
    ("exp5", [(1, 128, 0.05), (32, 4096, 1.6)]),
    ("exp6", [(1, 128, 0.05), (8, 1024, 0.4), (16, 2048, 0.8), (24, 3072, 1.2), (32, 4096, 1.6)]),
    ("exp7", [(32, 1024, 0.4)]),
    ("exp8", [(1, 128, 0.05), (16, 2048, 0.8), (24, 3072, 1.2), (32, 4096, 1.6)]),
    ("exp9", [(24, 3072, 1.2), (32, 4096, 1.6)]),
])
def test_full_profile_plans_the_thesis_runs(name, expected):
    got = [(r.workers, r.workers * r.settings["per_worker_batch"], round(_lr(r), 6)) for r in runs(name, "full")]
    assert got == expected


def test_warmups_match_the_thesis():
    kinds = {n: {(r.settings["warmup"], r.settings["warmup_epochs"]) for r in runs(n, "full") if r.workers > 1}
             for n in ("exp5", "exp6", "exp7", "exp8", "exp9")}
    assert kinds == {"exp5": {("none", 5)}, "exp6": {("stepping", 5)}, "exp7": {("stepping", 5)},
                     "exp8": {("gradual", 5)}, "exp9": {("gradual", 10)}}


def test_smoke_keeps_the_scaling_factor_of_every_run():
    """k thesis GPUs -> a global batch of k x 32 in one process: the linear rule scales the
    learning rate by the same factor k as on the cluster."""
    for name, exp in EXPERIMENTS.items():
        if exp.kind != "quality":
            continue
        for full, smoke in zip(runs(name, "full"), runs(name, "smoke")):
            assert smoke.workers == 1 and smoke.settings["dist"] == "none"
            k = full.workers * full.settings["per_worker_batch"] / 128
            assert smoke.settings["per_worker_batch"] == 32 * k
            cfg = make_config("smoke", **smoke.settings)
            cfg.validate()  # e.g. warmup shorter than the first learning-rate drop


def test_dry_run_prints_submissions_through_the_examples():
    out = subprocess.run([sys.executable, "-m", "guide_utils.experiments", "run", "exp6", "--profile", "full",
                          "--dry-run"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "slurm_examples/submit.sh slurm_examples/03_multi_node_horovod.sbatch --nodes=8 -- " in out.stdout
    assert "slurm_examples/submit.sh slurm_examples/01_single_gpu_baseline.sbatch -- " in out.stdout
    assert out.stdout.count("--warmup stepping") == 4
    assert [c for _, _, c in plan("exp2", "full") if "ddp" in c][0].startswith("DIST=ddp ")


@pytest.mark.parametrize("args, message", [
    (["run", "exp12"], "unknown experiment 'exp12'"),
    (["run", "exp6", "--index", "7"], "--index 7 is out of range: exp6 has runs 0 to 4"),
    (["run", "exp6", "--profile", "huge"], "argument --profile: invalid choice"),
])
def test_bad_input_is_one_line(args, message):
    out = subprocess.run([sys.executable, "-m", "guide_utils.experiments", *args], capture_output=True, text=True)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr


def test_a_cluster_run_refuses_a_launch_of_the_wrong_size(tmp_path):
    out = subprocess.run([sys.executable, "-m", "guide_utils.experiments", "run", "exp6", "--profile", "full",
                          "--index", "4", "--results-dir", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 2
    assert "needs 32 worker(s) but this launch has 1; start it as: slurm_examples/submit.sh" in out.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_running_a_smoke_experiment_writes_one_record_per_run(tmp_path):
    out = subprocess.run([sys.executable, "-m", "guide_utils.experiments", "run", "exp6", "--profile", "smoke",
                          "--results-dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    records = read_runs(tmp_path)
    assert sorted(r.name for r in records) == [f"exp6-smoke-run{i}" for i in range(5)]
    for r in records:
        assert len(r.epochs) == 10 and r.summary["completed_epochs"] == 10
    by_batch = {r.config["global_batch"]: r.config["peak_lr"] for r in records}
    assert by_batch == pytest.approx({32: 0.05, 256: 0.4, 512: 0.8, 768: 1.2, 1024: 1.6})
