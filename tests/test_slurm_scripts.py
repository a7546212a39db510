"""The sbatch examples as files: shellcheck-clean, built on the shared library, and moved
between sites by the site profile alone (what submit.sh would submit, without a Slurm)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "slurm_examples"
SCRIPTS = sorted(EXAMPLES.glob("[0-9][0-9]_*.sbatch"))
SHELL_FILES = [*SCRIPTS, *EXAMPLES.glob("*.sh"), *EXAMPLES.glob("lib/*.sh"), *EXAMPLES.glob("sites/*.sh")]


def test_the_examples_mirror_the_notebooks():
    assert [p.stem for p in SCRIPTS] == ["01_single_gpu_baseline", "02_single_node_data_parallel",
                                         "03_multi_node_horovod", "04_naive_scaling", "05_linear_scaling_rule",
                                         "06_learning_rate_warmup", "07_per_worker_batch_size", "08_tensorflow_horovod",
                                         "08_tensorflow_native", "10_communication", "12_stepwise_tuning"]


def test_shellcheck_is_clean():
    if not shutil.which("shellcheck"):
        pytest.fail("shellcheck is missing: scripts/setup.sh installs it (apt-get install shellcheck)")
    out = subprocess.run(["shellcheck", "-x", "-P", "SCRIPTDIR", *map(str, SHELL_FILES)], capture_output=True,
                         text=True, cwd=REPO)
    assert out.returncode == 0, out.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_script_follows_the_conventions(script):
    text = script.read_text()
    body = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert body[0] == "set -euo pipefail", "first command must be set -euo pipefail"
    assert "guide_setup" in body, "must call guide_setup (site profile, configuration, doctor, staging)"
    assert f"#SBATCH --job-name={script.stem}" in text
    srun_lines = [line for line in text.splitlines() if line.strip().startswith("srun ")]
    assert srun_lines or "horovodrun" in text, "every script launches with srun (or a launcher that ends all on a failure)"
    assert all("--kill-on-bad-exit=1" in line for line in srun_lines), srun_lines
    assert not re.search(r"--(account|partition|gres|gpus-per-node)=", text), "site values belong in the profile"


def _dry_run(site: str, script: str, *extra: str) -> str:
    env = {**os.environ, "GUIDE_SITE": site}
    out = subprocess.run([str(EXAMPLES / "submit.sh"), "--dry-run", str(EXAMPLES / script), *extra],
                         env=env, capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_only_the_site_profile_changes_between_centres():
    script = "03_multi_node_horovod.sbatch"
    ci = _dry_run("ci", script)
    taito = _dry_run("thesis-taito", script, "--nodes=8")
    modern = _dry_run("gpus-per-node-apptainer", script)
    assert "--ntasks-per-node=2 --cpus-per-task=1 " in ci and "gpu" not in ci.split(script)[0]
    assert "--ntasks-per-node=4 --account=project_0000000 --partition=gpu --cpus-per-task=7 --gres=gpu:p100:4" in taito
    assert "--nodes=8" in taito
    assert "--ntasks-per-node=8 --account=my_project --partition=gpu --cpus-per-task=8 --gpus-per-node=8" in modern
    # The single-GPU baseline pins one task per node: one GPU in the site's syntax.
    assert "--gres=gpu:p100:1" in _dry_run("thesis-taito", "01_single_gpu_baseline.sbatch")
    for out in (ci, taito, modern):
        assert str(EXAMPLES / script) in out  # the same script file everywhere


@pytest.mark.parametrize("site, message", [
    ("nowhere", "site profile '{examples}/sites/nowhere.sh' not found; set GUIDE_SITE to one of"),
])
def test_an_unknown_site_is_one_clear_line(site, message):
    env = {**os.environ, "GUIDE_SITE": site}
    out = subprocess.run([str(EXAMPLES / "submit.sh"), str(EXAMPLES / "01_single_gpu_baseline.sbatch")],
                         env=env, capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert message.format(examples=EXAMPLES) in out.stderr


def test_chain_refuses_what_it_sets_itself():
    out = subprocess.run([str(EXAMPLES / "chain.sh"), "3", "10", str(EXAMPLES / "01_single_gpu_baseline.sbatch"),
                          "--", "--epochs", "90"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2 and "do not pass --epochs" in out.stderr
