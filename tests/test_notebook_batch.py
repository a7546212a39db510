"""A chapter as a batch job: slurm_examples/09_notebook_batch.sbatch on the real test Slurm.

papermill executes the notebook on a "compute node" with the site's training profile as a
parameter plus the user's own, and the executed notebook lands next to the job log.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import nbformat
import pytest

import slurm_cluster

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "slurm_examples"

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.notebooks]


cluster = pytest.fixture(scope="module", name="cluster")(slurm_cluster.module_cluster)


def test_a_chapter_runs_as_a_batch_job_and_lands_next_to_its_log(cluster, tmp_path):
    # Chapter 0 without its two trainings (the sync check, the recorded points retrained): the
    # book build runs them, and tests/test_study.py the retraining; here the job matters.
    # A dataset in the profile: the job must not stage it (the notebook's runs are given none).
    archive = tmp_path / "digits.tar"
    archive.write_bytes(b"")
    logs = tmp_path / "logs"
    env = {**cluster.env, "GUIDE_SITE": "ci", "GUIDE_DATASET_ARCHIVE": str(archive), "GUIDE_LOG_DIR": str(logs),
           "GUIDE_RESULTS_DIR": str(tmp_path / "results"), "GUIDE_CI_SCRATCH": str(tmp_path / "scratch"),
           "NOTEBOOK": "notebooks/00_environment.ipynb"}
    out = subprocess.run([str(EXAMPLES / "submit.sh"), str(EXAMPLES / "09_notebook_batch.sbatch"), "--parsable",
                          "--", "-p", "run_sync_check", "False", "-p", "run_verify", "False"],
                         env=env, capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    (record,) = cluster.wait(job, timeout=600)
    log = logs / f"09_notebook_batch-{job}.out"
    assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), log.read_text()[-3000:]
    executed = logs / f"09_notebook_batch-{job}-00_environment.ipynb"
    assert executed.is_file(), sorted(os.listdir(logs))
    nb = nbformat.read(executed, as_version=4)
    assert nb.metadata.papermill.parameters == {"profile": "smoke", "results_dir": str(tmp_path / "results"),
                                                "run_sync_check": False, "run_verify": False}
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code if "injected-parameters" not in c.metadata.get("tags", []))
    assert "stack usable: yes" in "".join(o.get("text", "") for c in code for o in c.outputs)  # the doctor ran
    text = log.read_text()
    assert f"== executed notebook: {executed}" in text
    assert "== staging" not in text and not (tmp_path / "scratch").exists()
