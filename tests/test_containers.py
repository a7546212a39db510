"""Chapter 15's container recipe and site profile, tested as far as a machine without
Apptainer allows: the image is built by the venv's own set-up from the same pins, and the
profile drives every sbatch example. Building and running the image needs Apptainer
(not in Debian 12, nor on PyPI or npm): that test runs only where it is installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from guide_utils.cluster.container import exec_prefix, sections

REPO = Path(__file__).resolve().parents[1]
DEF = REPO / "containers" / "guide.def"
EXAMPLES = REPO / "slurm_examples"
SCRIPTS = sorted(EXAMPLES.glob("[0-9][0-9]_*.sbatch"))
PROFILE = "apptainer-example"


def test_the_image_is_made_by_the_venvs_setup_from_the_same_pins():
    """The package set inside the image is the lock's: the recipe copies requirements.txt
    and requirements.lock and runs scripts/setup.sh, whose every install (pip's and uv's) is
    constrained by the lock (the same command made this venv, which test_lock checks equals the lock);
    nothing else is pip-installed."""
    s = sections(DEF.read_text())
    assert s["header"][:2] == ["Bootstrap: docker", "From: python:3.11-slim-bookworm"]  # Debian 12, CPython 3.11
    copied = dict(line.split() for line in s["files"])
    for path in ("requirements.txt", "requirements.lock", "pyproject.toml", "scripts", "src"):
        assert copied.get(path) == f"/opt/guide/{path}", f"{path} must be copied to /opt/guide/{path}"
        assert (REPO / path).exists()
    post = "\n".join(s["post"])
    assert re.search(r"^VENV=/opt/guide/venv PYTHON=python3\.11 scripts/setup\.sh$", post, re.M)
    assert "pip" not in post, "packages come from scripts/setup.sh and the lock only"
    # pip installs uv and the Horovod wheel, uv everything else; every command is under the lock.
    setup = (REPO / "scripts" / "setup.sh").read_text()
    (uv,) = re.findall(r"^\s*uv=\((.*)\)$", setup, re.M)
    assert re.search(r"\bpip install\b.* -c requirements\.lock$", uv), uv
    installs = [ln.strip() for ln in setup.splitlines() if re.match(r'\s*(pip_install |"\$\{uv\[@\]\}" )', ln)]
    assert installs and all(ln.startswith('"${uv[@]}"') or "-c requirements.lock" in ln for ln in installs), installs
    requirements = r'"\$\{uv\[@\]\}" -r requirements\.txt --excludes "\$excluded"$'
    assert any(re.match(requirements, ln) for ln in installs), installs
    assert re.search(r"^excluded=scripts/excluded-packages\.txt$", setup, re.M)  # scripts/ is copied
    assert "export PATH=/opt/guide/venv/bin:$PATH" in s["environment"]
    assert any("horovodrun --check-build" in ln for ln in s["test"])


def _dry_run(script: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GUIDE_SITE": PROFILE}
    return subprocess.run([str(EXAMPLES / "submit.sh"), "--dry-run", str(script), *extra], env=env,
                          capture_output=True, text=True, cwd=REPO, timeout=60)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_the_apptainer_profile_drives_every_example(script):
    out = _dry_run(script)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith("sbatch ") and line.split()[-1].endswith(f"slurm_examples/{script.name}")
    assert "--account=my_project --partition=gpu --cpus-per-task=8 --gpus-per-node=" in line
    # submit.sh exports GUIDE_SITE to the job (--export=ALL) rather than listing it
    assert "--export=ALL" in line


def test_the_apptainer_profile_binds_scratch_and_project_and_passes_the_gpus():
    profile = EXAMPLES / "sites" / f"{PROFILE}.sh"
    assert "GUIDE_SOFTWARE=apptainer" in profile.read_text().splitlines()
    assert exec_prefix(profile, local_scratch="/local/job42") == [
        str(EXAMPLES / "lib" / "apptainer_env.sh"), "apptainer", "exec", "--cleanenv", "--nv", "-B", "/local/job42",
        "-B", "/scratch/my_project", "-B", f"{REPO}/src:/opt/guide/src:ro", "/projappl/my_project/guide.sif"]


def _net_profile(tmp_path: Path, libs: str) -> Path:
    """The Apptainer profile with an image that exists here and ``libs`` as GUIDE_APPTAINER_NET_LIBS."""
    (tmp_path / "guide.sif").touch()
    profile = tmp_path / "site.sh"
    profile.write_text((EXAMPLES / "sites" / f"{PROFILE}.sh").read_text()
                       + f"GUIDE_CONTAINER={tmp_path}/guide.sif\nGUIDE_APPTAINER_NET_LIBS=({libs})\n")
    return profile


def test_the_hosts_network_libraries_are_bound_into_the_image_where_the_profile_names_them(tmp_path):
    """GUIDE_APPTAINER_NET_LIBS (the host's libfabric and aws-ofi-nccl, folders or files): each
    bound read-only at its own path, their folders on the image's LD_LIBRARY_PATH, where NCCL
    looks for its plugin; a path the node does not have stops the job in one line."""
    ofi, cxi = tmp_path / "opt/aws-ofi-nccl/lib", tmp_path / "usr/lib64/libcxi.so.1"
    ofi.mkdir(parents=True)
    cxi.parent.mkdir(parents=True)
    cxi.touch()
    profile = _net_profile(tmp_path, f"{ofi} {cxi}")
    script = f'source "{EXAMPLES}/lib/guide.sh"; guide_load_site; guide_software; printf "%s\\n" "${{GUIDE_EXEC[@]}}"'
    env = {**os.environ, "GUIDE_SITE": str(profile), "LOCAL_SCRATCH": "/l", "GUIDE_ROOT": str(REPO)}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    net = ["-B", f"{ofi}:{ofi}:ro", "-B", f"{cxi}:{cxi}:ro", "--env", f"LD_LIBRARY_PATH={ofi}:{cxi.parent}"]
    src = ["-B", f"{REPO}/src:/opt/guide/src:ro"]  # the checkout's guide_utils over the image's
    assert out.stdout.splitlines()[-len(net) - 3:] == [*net, *src, f"{tmp_path}/guide.sif"], out.stdout
    assert exec_prefix(profile, local_scratch="/l")[-len(net) - 3:] == [*net, *src, f"{tmp_path}/guide.sif"]
    out = subprocess.run(["bash", "-c", script], env={**env, "GUIDE_SITE": str(_net_profile(tmp_path, "/no/such"))},
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "GUIDE_APPTAINER_NET_LIBS in" in out.stderr and "names /no/such, which this node does not have" in out.stderr
    # none named (the shipped profiles): nothing added
    assert exec_prefix(_net_profile(tmp_path, ""), local_scratch="/l")[-4:] == ["/scratch/my_project", *src,
                                                                                f"{tmp_path}/guide.sif"]


@pytest.mark.slow
def test_the_image_builds_and_trains_one_smoke_epoch(tmp_path):
    runtime = shutil.which("apptainer") or shutil.which("singularity")
    if runtime is None:
        pytest.skip("no Apptainer/SingularityCE here: not in Debian 12's archive, on PyPI or npm (chapter 15 "
                    "says what was not run); this test builds and runs the image where one is installed")
    image = tmp_path / "guide.sif"
    build = subprocess.run([runtime, "build", "--fakeroot", str(image), str(DEF)], cwd=REPO, capture_output=True,
                           text=True, timeout=3600)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([runtime, "exec", "-B", str(tmp_path), str(image), "python", "-m", "guide_utils.train",
                          "--profile", "smoke", "--epochs", "1", "--no-progress", "--results-dir", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(list((tmp_path / "r").glob("*.jsonl"))) == 1


def test_cleanenv_keeps_the_hosts_environment_out_and_passes_the_tasks_in():
    """apptainer_env.sh (what lib/guide.sh puts before `apptainer exec --cleanenv`): srun's
    and the job's variables go in as APPTAINERENV_NAME, which Apptainer sets as NAME inside
    the image even under --cleanenv; a module's PYTHONPATH or LD_LIBRARY_PATH does not."""
    env = {"PATH": os.environ["PATH"], "SLURM_PROCID": "3", "PMIX_RANK": "3", "MASTER_ADDR": "node1",
           "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO", "GUIDE_SITE": "apptainer-example",
           "PYTHONPATH": "/appl/modules/python", "LD_LIBRARY_PATH": "/appl/lib", "LMOD_CMD": "/appl/lmod"}
    out = subprocess.run([str(EXAMPLES / "lib" / "apptainer_env.sh"), "env"], env=env, capture_output=True,
                         text=True, timeout=30, check=True).stdout.splitlines()
    passed = {line.split("=", 1)[0].removeprefix("APPTAINERENV_") for line in out if line.startswith("APPTAINERENV_")}
    assert passed == {"SLURM_PROCID", "PMIX_RANK", "MASTER_ADDR", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "GUIDE_SITE"}
    assert "APPTAINERENV_SLURM_PROCID=3" in out


def test_every_apptainer_profile_cleans_the_environment():
    for profile in sorted((EXAMPLES / "sites").glob("*apptainer*.sh")):
        flags = subprocess.run(["bash", "-c", f'source "{profile}"; printf "%s\\n" "${{GUIDE_APPTAINER_FLAGS[@]}}"'],
                               env={**os.environ, "LOCAL_SCRATCH": "/l"}, capture_output=True, text=True,
                               timeout=30, check=True).stdout.split()
        assert flags[0] == "--cleanenv", profile.name
