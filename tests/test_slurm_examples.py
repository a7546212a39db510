"""Every sbatch example, submitted to a real two-node Slurm started on this machine.

The CI site profile (slurm_examples/sites/ci.sh) runs the examples at smoke scale: CPUs,
a small ResNet, scikit-learn's digits packed as an image archive and staged to "node-local"
scratch like ImageNet would be. Each test checks what a user would: the job COMPLETED with
exit code 0, and the run records the notebooks read are there with every epoch.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from guide_utils.results.records import read_run
from slurm_cluster import SlurmCluster, SlurmUnavailable

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "slurm_examples"
SMOKE_EPOCHS = 4  # the smoke profile's

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.multiprocess]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
    except SlurmUnavailable as exc:
        c.stop()
        pytest.skip(f"no test Slurm: {exc}")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dataset") / "digits.tar"
    subprocess.run([str(REPO / ".venv/bin/python"), "-m", "guide_utils", "pack-dataset", "digits", str(out)],
                   check=True, capture_output=True)
    return out


class Submission:
    """Where one test's jobs write (results, logs, checkpoints, scratch) and how to submit."""

    def __init__(self, cluster: SlurmCluster, tmp: Path, archive: Path, **env: str):
        self.cluster, self.tmp = cluster, tmp
        self.results, self.logs = tmp / "results", tmp / "logs"
        self.env = {**cluster.env, "GUIDE_SITE": "ci", "GUIDE_DATASET_ARCHIVE": str(archive),
                    "GUIDE_RESULTS_DIR": str(self.results), "GUIDE_LOG_DIR": str(self.logs),
                    "GUIDE_CHECKPOINT_ROOT": str(tmp / "checkpoints"), "GUIDE_CI_SCRATCH": str(tmp / "scratch"),
                    **env}

    def submit(self, script: str, *sbatch: str, train: tuple[str, ...] = ()) -> str:
        out = subprocess.run([str(EXAMPLES / "submit.sh"), str(EXAMPLES / script), "--parsable", *sbatch,
                              "--", *train], env=self.env, capture_output=True, text=True, cwd=REPO)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().split(";")[0]

    def log(self, tail: int | None = None) -> str:
        """Every job log of this test, whole or (for failure messages) the last characters."""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-tail if tail else 0:]}"
                         for p in sorted(self.logs.glob("*.out")))

    def wait_completed(self, job_id: str, timeout: float = 600) -> list[dict]:
        records = self.cluster.wait(job_id, timeout)
        states = [(r.get("ArrayTaskId"), r["JobState"], r["ExitCode"]) for r in records]
        assert all(r["JobState"] == "COMPLETED" and r["ExitCode"] == "0:0" for r in records), \
            f"{states}\n{self.log(3000)}"
        return records

    def runs(self):
        return [read_run(p) for p in sorted(self.results.glob("*.jsonl"))]


@pytest.fixture
def jobs(cluster, archive, tmp_path):
    return Submission(cluster, tmp_path, archive)


def _finished(run, epochs: int = SMOKE_EPOCHS) -> None:
    assert run.epochs["epoch"].tolist() == list(range(1, epochs + 1)), run.path
    assert run.summary is not None and run.summary["completed_epochs"] == epochs, run.path
    assert run.summary["ranks_agree"], run.summary  # every worker ended with the same weights


def test_single_gpu_baseline_requeues_at_the_time_limit_and_finishes(jobs):
    """A 2-minute limit, warned 60 s before: the run needs longer, so it must checkpoint,
    requeue itself and resume, and still end with every epoch."""
    job = jobs.submit("01_single_gpu_baseline.sbatch", "--time=2", "--signal=B:USR1@60", train=("--epochs", "40"))
    (record,) = jobs.wait_completed(job, timeout=900)
    assert int(record["Restarts"]) >= 1, f"the job was never requeued\n{jobs.log(3000)}"
    assert "requeueing job" in jobs.log()
    (run,) = jobs.runs()  # one record, continued across restarts
    _finished(run, 40)
    assert [e for e in run.events if e["type"] == "resume"], "no resume recorded"
    assert run.environment["workers"] == 1


def test_dependency_chain_resumes_from_the_previous_jobs_checkpoint(jobs):
    out = subprocess.run([str(EXAMPLES / "chain.sh"), "2", "2", str(EXAMPLES / "01_single_gpu_baseline.sbatch")],
                         env=jobs.env, capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    ids = re.findall(r"job \d+/2: (\d+)", out.stdout)
    assert len(ids) == 2, out.stdout
    for job in ids:
        jobs.wait_completed(job)
    (run,) = jobs.runs()
    _finished(run, 4)
    assert "resuming checkpoint-epoch0002.pt at epoch 2" in jobs.log()


@pytest.mark.parametrize("dist", ["horovod", "ddp"])
def test_one_node_data_parallel(cluster, archive, tmp_path, dist):
    jobs = Submission(cluster, tmp_path, archive, DIST=dist)
    jobs.wait_completed(jobs.submit("02_single_node_data_parallel.sbatch"))
    (run,) = jobs.runs()
    _finished(run)
    assert (run.config["dist"], run.environment["workers"]) == (dist, 2)


@pytest.mark.parametrize("launcher, dist", [("srun", "horovod"), ("mpirun", "horovod"), ("torchrun", "ddp"),
                                            ("srun-ddp", "ddp")])
def test_multi_node(cluster, archive, tmp_path, launcher, dist):
    jobs = Submission(cluster, tmp_path, archive, LAUNCHER=launcher)
    jobs.wait_completed(jobs.submit("03_multi_node_horovod.sbatch"))
    (run,) = jobs.runs()
    _finished(run)
    assert (run.config["dist"], run.environment["workers"]) == (dist, 4)
    assert sorted(run.environment["slurm"]["nodes"]) == ["guide-n1", "guide-n2"]
    log = jobs.log()  # the job printed its configuration and the doctor's report before staging
    assert log.index("== site ci") < log.index("stack usable: yes") < log.index("== staging")


@pytest.mark.parametrize("script, expected", [
    ("04_naive_scaling.sbatch", [(32, "none", "none"), (64, "none", "none"), (128, "none", "none")]),
    ("05_linear_scaling_rule.sbatch", [(32, "linear", "none"), (64, "linear", "none"), (128, "linear", "none")]),
    ("06_learning_rate_warmup.sbatch", [(32, "linear", "stepping"), (64, "linear", "stepping"),
                                        (128, "linear", "stepping")]),
    ("07_per_worker_batch_size.sbatch", [(32, "linear", "stepping"), (128, "linear", "stepping")]),
])
def test_job_array_writes_one_record_per_task(jobs, script, expected):
    records = jobs.wait_completed(jobs.submit(script))
    assert sorted(int(r["ArrayTaskId"]) for r in records) == list(range(len(expected)))
    runs = jobs.runs()
    assert len(runs) == len(expected), [r.name for r in runs]
    for run in runs:
        _finished(run)
    got = sorted((r.config["per_worker_batch"], r.config["lr_scaling"], r.config["warmup"]) for r in runs)
    assert got == expected


def test_an_incomplete_site_profile_stops_before_anything_runs(jobs, tmp_path):
    broken = tmp_path / "broken.sh"
    broken.write_text("".join(line for line in (EXAMPLES / "sites/ci.sh").read_text().splitlines(keepends=True)
                              if not line.startswith("GUIDE_SCRATCH=")))
    env = {**jobs.env, "GUIDE_SITE": str(broken)}
    # Through submit.sh: refused on the login node, nothing submitted.
    out = subprocess.run([str(EXAMPLES / "submit.sh"), str(EXAMPLES / "01_single_gpu_baseline.sbatch")],
                         env=env, capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"error: site profile {broken} does not set GUIDE_SCRATCH; add it "
                                               "(see slurm_examples/sites/TEMPLATE.sh)"]
    assert "Traceback" not in out.stderr and not jobs.logs.exists()
    # With plain sbatch: the job stops at its first line, before staging or training.
    jobs.logs.mkdir()
    out = subprocess.run(["sbatch", "--parsable", f"--output={jobs.logs}/%x-%j.out",
                          str(EXAMPLES / "01_single_gpu_baseline.sbatch")], env=env, capture_output=True,
                         text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    (record,) = jobs.cluster.wait(out.stdout.strip())
    assert (record["JobState"], record["ExitCode"]) == ("FAILED", "2:0")
    assert "does not set GUIDE_SCRATCH" in jobs.log() and "staging" not in jobs.log()
    assert not jobs.results.exists()


# SlurmClusterResolver gives the tasks of every node the same ports (port base + local
# index), which is right on real nodes; the tests' two "nodes" are one host, so the native
# strategy runs on one of them (two workers) and Horovod on both (four).
@pytest.mark.parametrize("script, dist, sbatch, workers", [
    ("08_tensorflow_horovod.sbatch", "horovod", (), 4),
    ("08_tensorflow_native.sbatch", "mwms", ("--nodes=1",), 2),
])
def test_tensorflow(jobs, script, dist, sbatch, workers):
    jobs.wait_completed(jobs.submit(script, *sbatch))
    (run,) = jobs.runs()
    _finished(run)
    assert (run.config["framework"], run.config["dist"], run.environment["workers"]) == ("tensorflow", dist, workers)
    if dist == "horovod":
        assert sorted(run.environment["slurm"]["nodes"]) == ["guide-n1", "guide-n2"]
        assert len(run.summary["weights_digests"]) == 4
