"""The experiment catalogue: the thesis's runs at full scale, their smoke counterparts, the
dry run's commands, and a smoke experiment actually run through the engine."""

from __future__ import annotations

import subprocess
import sys

import pytest

from guide_utils.core.config import make_config
from guide_utils.core.errors import GuideError
from guide_utils.studies.experiments import EXPERIMENTS, SMOKE_WARMUP, plan, runs
from guide_utils.core.records import read_runs
from guide_utils.core.scaling import global_batch, scaled_lr


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


def test_every_smoke_warmup_ends_before_the_first_drop():
    """A warmup that ends at the first learning-rate drop never trains at its peak rate (smoke
    exp9 once warmed up for 10 epochs with its first drop at epoch 10); the thesis's runs spent
    at least 20 epochs at the peak. At smoke scale every warmed-up run keeps a tenth of its
    epochs at the peak, and exp9 still warms up longer than exp8."""
    for name in ("exp6", "exp7", "exp8", "exp9"):
        for r in runs(name, "smoke"):
            s = r.settings
            assert (min(s["milestones"]) - s["warmup_epochs"]) / s["epochs"] >= 0.1, (name, r.label)
    assert SMOKE_WARMUP[10] > SMOKE_WARMUP[5]
    assert all(f"warmup {SMOKE_WARMUP[10]} ep" in r.label for r in runs("exp9", "smoke"))


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
    out = subprocess.run([sys.executable, "-m", "guide_utils", "experiments", "run", "exp6", "--profile", "full",
                          "--dry-run"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "slurm_examples/submit.sh slurm_examples/03_multi_node_horovod.sbatch --workers=8 -- " in out.stdout
    assert "slurm_examples/submit.sh slurm_examples/01_single_gpu_baseline.sbatch -- " in out.stdout
    assert out.stdout.count("--warmup stepping") == 4
    assert [c for _, _, c in plan("exp2", "full") if "ddp" in c][0].startswith("DIST=ddp ")


@pytest.mark.parametrize("args, message", [
    (["run", "exp12"], "unknown experiment 'exp12'"),
    (["run", "exp6", "--index", "7"], "--index 7 is out of range: exp6 has runs 0 to 4"),
    (["run", "exp6", "--profile", "huge"], "argument --profile: invalid choice"),
])
def test_bad_input_is_one_line(args, message):
    out = subprocess.run([sys.executable, "-m", "guide_utils", "experiments", *args], capture_output=True, text=True)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr


def test_a_cluster_run_refuses_a_launch_of_the_wrong_size(tmp_path):
    out = subprocess.run([sys.executable, "-m", "guide_utils", "experiments", "run", "exp6", "--profile", "full",
                          "--index", "4", "--results-dir", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 2
    assert "needs 32 worker(s) but this launch has 1; start it as: slurm_examples/submit.sh" in out.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_running_a_smoke_experiment_writes_one_record_per_run(tmp_path):
    # The first epoch of every run (--epochs 1): the catalogue's runs become records, each
    # with its own global batch and scaled learning rate. exp9: two runs, both large batches
    # (seconds); the notebooks run the other experiments through the same catalogue.
    out = subprocess.run([sys.executable, "-m", "guide_utils", "experiments", "run", "exp9", "--profile", "smoke",
                          "--epochs", "1", "--results-dir", str(tmp_path)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    records = read_runs(tmp_path)
    assert sorted(r.name for r in records) == [f"exp9-smoke-run{i}" for i in range(2)]
    for r in records:
        assert len(r.epochs) == 1 and r.summary["completed_epochs"] == 1 and r.config["epochs"] == 1
        assert (r.config["warmup"], r.config["warmup_epochs"]) == ("gradual", SMOKE_WARMUP[10])
    by_batch = {r.config["global_batch"]: r.config["peak_lr"] for r in records}
    assert by_batch == pytest.approx({768: 1.2, 1024: 1.6})


@pytest.mark.parametrize("name, profile", [("exp2", "smoke"), ("exp6", "smoke"), ("exp9", "full"), ("slices", "full")])
def test_the_compact_plan_is_one_short_line_per_run(name, profile, capsys):
    """What a notebook shows: no commands, no paths, lines that fit a book's column."""
    from guide_utils.studies.experiments import print_plan

    print_plan(name, profile, commands=False)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(runs(name, profile)) + 5
    assert max(map(len, lines)) <= 100 and not any("$ " in line or "/" in line for line in lines)
    assert lines[0].startswith(f"{name}: ") and EXPERIMENTS[name].source in lines[1]


def test_describe_names_what_each_full_run_trains():
    from guide_utils.studies.experiments import describe

    [(_, run, _)] = plan("exp9", "full", 1)
    assert describe(run, "full") == ("resnet50 on ImageNet (the site's GUIDE_DATASET_ARCHIVE); 32 worker(s) x 128 = "
                                     "global batch 4096; "
                                     "lr 1.6 (linear rule), gradual warmup 10 epochs; 90 epoch(s)")


@pytest.mark.parametrize("launcher, head", [("horovodrun", ["-np", "2", "-H", "localhost:2", "--gloo"]),
                                            ("torchrun", ["--standalone", "--nproc-per-node", "2"])])
def test_local_launch_commands(launcher, head):
    from guide_utils.runtime.launch import command

    argv = command(launcher, 2, "guide_utils.train", ["--dist", "x"])
    assert argv[0].endswith(launcher) and argv[1:1 + len(head)] == head and argv[-2:] == ["--dist", "x"]


@pytest.mark.multiprocess
def test_a_checked_horovodrun_launches_the_same_without_its_build_check(tmp_path):
    """check-script's runs after its first: the same horovodrun arguments, started by the
    wrapper that skips the build check (a TensorFlow import in a forked interpreter), and
    the workers still get Horovod's ranks."""
    from guide_utils.runtime.launch import command

    plain, checked = (command("horovodrun", 2, "guide_utils.train", [], checked=c) for c in (False, True))
    assert checked[:3] == [sys.executable, "-m", "guide_utils.runtime.horovodrun"] and checked[3:] == plain[1:]
    probe = 'import os; open(os.environ["HOROVOD_RANK"], "w").write(os.environ["HOROVOD_SIZE"])'
    out = subprocess.run([*checked[:checked.index(sys.executable, 3)], sys.executable, "-c", probe], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert sorted((p.name, p.read_text()) for p in tmp_path.iterdir()) == [("0", "2"), ("1", "2")]
    assert "tensorflow" not in (out.stdout + out.stderr).lower()  # no framework imported by the launcher


LOOPBACK_VARS = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE", "OMPI_MCA_btl_tcp_if_include",
                 "OMPI_MCA_oob_tcp_if_include")


def test_local_workers_are_pinned_to_loopback(monkeypatch):
    """Every worker launch.run starts is on this machine: rendezvous, Gloo, TensorPipe and
    OpenMPI's TCP are pinned to loopback (nothing reachable from the network), unless the
    caller's environment already chose; horovodrun is told the interface too."""
    from guide_utils.runtime.launch import command, environment, loopback_interface

    for name in ("MASTER_ADDR", *LOOPBACK_VARS):
        monkeypatch.delenv(name, raising=False)
    lo = loopback_interface()
    assert lo in ("lo", "lo0")
    env = environment()
    assert env["MASTER_ADDR"] == "127.0.0.1" and {env[v] for v in LOOPBACK_VARS} == {lo}
    argv = command("horovodrun", 2, "guide_utils.train", [])
    assert argv[argv.index("--network-interface") + 1] == lo
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    assert environment()["GLOO_SOCKET_IFNAME"] == "eth7"


def test_local_mpi_ranks_keep_openmpis_waiting_unless_the_caller_chose(monkeypatch):
    """Workers started here keep OpenMPI's default (spinning while they wait): chapter 10's
    two-worker study compares it with yielding (perf.twoworkers: horovod-mpi vs
    horovod-mpi-yield), and a default set here would make both setups the same. A caller's
    or a setup's own choice reaches the workers."""
    from guide_utils.perf import twoworkers
    from guide_utils.runtime.launch import environment

    monkeypatch.delenv("OMPI_MCA_mpi_yield_when_idle", raising=False)
    assert "OMPI_MCA_mpi_yield_when_idle" not in environment()
    assert dict(twoworkers.SETUPS["horovod-mpi"].env) == {}
    assert dict(twoworkers.SETUPS["horovod-mpi-yield"].env) == {"OMPI_MCA_mpi_yield_when_idle": "1"}
    monkeypatch.setenv("OMPI_MCA_mpi_yield_when_idle", "1")
    assert environment()["OMPI_MCA_mpi_yield_when_idle"] == "1"


def test_unknown_launcher_and_mismatched_dist_are_refused(tmp_path):
    from guide_utils.core.errors import GuideError
    from guide_utils.studies.experiments import launch
    from guide_utils.runtime.launch import command

    with pytest.raises(GuideError, match="unknown launcher"):
        command("pdsh", 2, "guide_utils.train", [])
    ddp = next(i for i, r, _ in plan("exp2", "smoke") if r.settings["dist"] == "ddp")
    with pytest.raises(GuideError, match="torchrun"):
        launch("exp2", ddp, "smoke", results_dir=str(tmp_path), launcher="horovodrun")
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.multiprocess
# horovod: chapter 2 launches exp2's Horovod runs (and its DDP runs) and the book build runs it
@pytest.mark.parametrize("dist", ["ddp"])
def test_launch_runs_a_two_worker_smoke_run(tmp_path, dist):
    """What notebook 02 does: the catalogue's 2-worker run, started by its launcher, one record."""
    from guide_utils.studies.experiments import launch

    index = next(i for i, r, _ in plan("exp2", "smoke") if r.settings["dist"] == dist and r.workers == 2)
    path = launch("exp2", index, "smoke", results_dir=str(tmp_path))
    [run] = read_runs(tmp_path)
    assert run.path == path and run.config["workers"] == 2 and run.config["dist"] == dist
    assert run.summary["ranks_agree"] and len(run.summary["weights_digests"]) == 2
    assert run.epochs["images_per_second"].iloc[-1] > 0


def test_a_full_run_larger_than_this_nodes_gpus_is_refused_before_it_starts(tmp_path, monkeypatch):
    """A notebook at the full profile on one node (09_notebook_batch.sbatch): a run of more
    workers than the node has GPUs would put several ranks on each GPU (or run out of memory
    hours in); it stops with one line naming the job to submit instead, and starts nothing."""
    import torch

    from guide_utils.studies.experiments import launch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    [(i, run, command)] = [p for p in plan("exp5", "full") if p[1].workers == 32][:1]
    with pytest.raises(GuideError, match=r"needs 32 worker\(s\) with a GPU each, but this node has 4; submit it as a "
                                         r"job instead: ") as err:
        launch("exp5", i, "full", results_dir=str(tmp_path))
    assert command in str(err.value) and not list(tmp_path.iterdir())


def test_an_experiment_run_is_a_point_of_the_experiments_study():
    """``run`` trains an experiment's runs as the experiments' Study: each run is a point that
    names its record and labels it with the experiment and its index."""
    from guide_utils.studies.experiments import STUDY, ExperimentRun

    [(i, run, _)] = plan("exp9", "smoke", 1)
    point = ExperimentRun("exp9", i, run, "smoke")
    cfg = point.config(epochs=1)
    assert point.key() == {"experiment": "exp9", "index": 1} and cfg.epochs == 1
    assert cfg.run_name == "exp9-smoke-run1" and point.config(run_name="mine").run_name == "mine"
    assert cfg.extra == {"experiment": "exp9", "run_index": 1, "label": run.label}
    assert set(STUDY.key) <= set(STUDY.columns) and STUDY.threads == ()


def test_emulated_gradual_warmup_starts_at_one_thesis_gpus_rate():
    """One process standing in for k workers must not start its warmup at its own (k-fold) rate:
    that would make gradual warmup a no-op. It starts where one of the k workers would."""
    gradual = [(name, r) for name in EXPERIMENTS for r in runs(name, "smoke") if r.settings.get("warmup") == "gradual"]
    assert gradual
    for name, r in gradual:
        cfg = make_config("smoke", **r.settings)
        assert cfg.warmup_start_lr() == pytest.approx(0.05), name  # base lr 0.05 at batch 32
        assert scaled_lr(cfg.base_lr, cfg.base_batch, cfg.per_worker_batch) > 0.05 * 15
