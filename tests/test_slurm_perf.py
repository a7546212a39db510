"""The performance chapters' sbatch examples on the real two-node test Slurm (tests/slurm_cluster.py):
the communication benchmark across both nodes, and a monitored training run.

Each test checks what a user would: the job COMPLETED with exit code 0, the comms results
cover every size with bus bandwidths by nccl-tests' formula for the job's four workers, and
the monitored run's record holds utilisation samples the chapter's plot can draw.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import slurm_cluster

from guide_utils.perf import comms
from guide_utils.results import plots
from guide_utils.core.records import read_run
from slurm_cluster import SlurmCluster

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "slurm_examples"

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.multiprocess]


cluster = pytest.fixture(scope="module", name="cluster")(slurm_cluster.module_cluster)


archive = pytest.fixture(scope="module", name="archive")(slurm_cluster.digits_archive)


class Jobs:
    """Where one test's jobs write, and how they are submitted (through submit.sh, site ci)."""

    def __init__(self, cluster: SlurmCluster, tmp: Path, archive: Path, **env: str):
        self.cluster, self.results, self.logs = cluster, tmp / "results", tmp / "logs"
        self.env = {**cluster.env, "GUIDE_SITE": "ci", "GUIDE_DATASET_ARCHIVE": str(archive),
                    "GUIDE_RESULTS_DIR": str(self.results), "GUIDE_LOG_DIR": str(self.logs),
                    "GUIDE_CHECKPOINT_ROOT": str(tmp / "checkpoints"), "GUIDE_CI_SCRATCH": str(tmp / "scratch"), **env}

    def run(self, script: str, *args: str, timeout: float = 600) -> str:
        out = subprocess.run([str(EXAMPLES / "submit.sh"), str(EXAMPLES / script), "--parsable", *args],
                             env=self.env, capture_output=True, text=True, cwd=REPO)
        assert out.returncode == 0, out.stderr
        job = out.stdout.strip().split(";")[0]
        records = self.cluster.wait(job, timeout)
        log = "\n".join(p.read_text() for p in sorted(self.logs.glob("*.out")))
        assert all(r["JobState"] == "COMPLETED" and r["ExitCode"] == "0:0" for r in records), \
            f"{[(r['JobState'], r['ExitCode']) for r in records]}\n{log[-4000:]}"
        return log


@pytest.mark.parametrize("runtime, expected", [("horovod", "horovod-mpi"), ("torch", "torch-gloo")])
def test_communication_benchmark_across_two_nodes(cluster, archive, tmp_path, runtime, expected):
    jobs = Jobs(cluster, tmp_path, archive, RUNTIME=runtime)
    log = jobs.run("10_communication.sbatch", "--", "--max-bytes", "64K", "--budget", "1M", "--model", "small_resnet",
                   "--iters", "1", "--ddp-buckets", "1")
    (path,) = jobs.results.glob("comms-*.jsonl")
    rows = comms.read_rows(path)
    assert [r["kind"] for r in rows].count("meta") == 1, "rank 0 alone writes"
    sweep = [r for r in rows if r["kind"] == "allreduce"]
    assert [r["bytes"] for r in sweep] == [4 * 4**i for i in range(8)]
    for r in sweep:
        assert (r["runtime"], r["workers"], r["correct"]) == (expected, 4, True)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * 3 / 4)
    assert any(r["kind"] == "gradients" for r in rows)
    assert "busbw_GBps" in log and "64 KiB" in log  # the job printed its tables


def test_monitored_run_records_utilisation(cluster, archive, tmp_path):
    jobs = Jobs(cluster, tmp_path, archive, MONITOR="0.2")
    log = jobs.run("12_stepwise_tuning.sbatch", "--nodes=1", "--", "--epochs", "2", "--max-steps-per-epoch", "6")
    (path,) = jobs.results.glob("*.jsonl")
    run = read_run(path)
    assert run.summary is not None and run.summary["ranks_agree"]
    assert run.config["monitor"] == 0.2 and run.environment["workers"] == 2
    assert len(run.samples) >= 2, f"no utilisation samples\n{log[-3000:]}"
    assert {"t", "cpu_percent", "cpu_percent_per_core", "process_cpu_percent"} <= set(run.samples.columns)
    plots.utilisation(run)  # the chapter's figure draws from it
