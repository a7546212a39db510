"""Chapter 15's image built and run on this machine: containers/Containerfile with podman
(Debian 12 has podman, not Apptainer). The image is made from the same requirements.lock as
the venv, carries only what training needs, trains one smoke epoch, and saves as the
docker-archive that `apptainer build guide.sif docker-archive://guide.tar` converts.

The first build of the image takes minutes (the venv's 6.7 GB); the set-up does not make it
(no notebook needs it): this module's fixture builds it when it is missing (as `make image`
does), and reuses it while its inputs stay the same (one line says which).
Where podman is missing or cannot start a container, the tests that need it skip and say why."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from guide_utils.cluster import image as img
from guide_utils.cluster import podman

REPO = Path(__file__).resolve().parents[1]
CONTAINERFILE = REPO / "containers" / "Containerfile"
RUNTIME = REPO / "containers" / "requirements-runtime.txt"
# Debian packages and Python distributions a training run does not need, which the venv's
# machine has (scripts/setup.sh, requirements.txt) and the image must not.
NOT_DEBIAN = ("slurm-wlm", "slurmd", "slurmctld", "munge", "chromium", "chromium-driver", "nodejs", "npm",
              "shellcheck", "g++", "gcc", "cmake", "make", "libopenmpi-dev", "python3.11-venv", "python3-pip")
NOT_PYTHON = ("tensorflow-cpu", "keras", "jupyter-book", "jupyterlab", "jupyterhub", "notebook", "papermill",
              "sphinx", "pytest", "nbval", "hypothesis", "selenium", "ansible-core", "ansible-lint", "ruff",
              "import-linter", "ipyparallel", "mpi4py", "uv", "pip")


def test_every_runtime_pin_is_the_locks():
    """The image's requirements are a subset of the venv's lock, pin for pin (and installed
    under it: the Containerfile passes -c requirements.lock)."""
    lock, runtime = img.pins(REPO / "requirements.lock"), img.pins(RUNTIME)
    assert runtime and "torch" in runtime
    differ = {name: (version, lock.get(name)) for name, version in runtime.items() if lock.get(name) != version}
    assert not differ, f"containers/requirements-runtime.txt disagrees with requirements.lock: {differ}"
    text = CONTAINERFILE.read_text()
    assert "-c requirements.lock -r requirements-runtime.txt" in text


def test_the_containerfile_installs_no_tool_training_does_not_need():
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert [s.split()[0] for s in stages] == ["${BASE}", "${BASE}", "${ENV_IMAGE}"]
    installed = set()
    for line in text.splitlines():
        if "apt-get install" in line:
            installed |= {w for w in line.split("apt-get install", 1)[1].split() if not w.startswith("-")
                          and re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", w)}
    assert "python3.11" in installed and "libopenmpi3" in installed
    assert not installed & (set(NOT_DEBIAN) - {"python3.11-venv"}), installed & set(NOT_DEBIAN)
    runtime_stage = stages[1]
    assert "python3.11-venv" not in runtime_stage and "COPY --from=build /opt/guide/venv" in runtime_stage


def test_the_recorded_measurement_says_where_and_from_what_it_was_made():
    """Chapter 15 prints results/recorded/container_image.jsonl: a first build from an empty
    podman store with one smoke epoch, the same inputs reused, and the docker-archive."""
    rec = img.recorded()
    first, again = rec["first"], rec["again"]
    assert "cores" in first["machine"] and first["podman"].startswith("podman version")
    assert first["build"]["base_seconds"] > 0 and first["build"]["env_seconds"] > 60
    assert again["build"]["env_tag"] == first["build"]["env_tag"] and again["build"]["wall_seconds"] < 30
    assert first["smoke"]["epochs"] == 1 and rec["saved"]["save"]["bytes"] > 1e9
    commit = first["commit"].split()[0]
    if (REPO / ".git").exists():
        known = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"])
        assert known.returncode == 0, f"commit {commit} is not in this repository's history"


def test_a_new_pin_the_image_does_not_install_keeps_its_tag(tmp_path):
    """The image's tag hashes the lock's pins of what it installs, not the whole lock: a new
    ruff pin (a test tool) keeps the image, a new numpy pin rebuilds it."""
    def env_tag(lock: str) -> str:
        root = Path(tempfile.mkdtemp(dir=tmp_path))
        (root / "containers").mkdir()
        (root / "src").mkdir()
        for rel in img.CONTEXT_FILES:
            shutil.copy(REPO / rel, root / rel)
        (root / "requirements.lock").write_text(lock)
        return img.tags(root, wheel, "base")[0]

    wheel = tmp_path / "horovod.whl"
    wheel.write_text("")
    lock = (REPO / "requirements.lock").read_text()
    ruff, numpy = img.pins(REPO / "requirements.lock")["ruff"], img.pins(REPO / "requirements.lock")["numpy"]
    if img.runtime_pins(REPO) is None:
        pytest.skip("this venv lacks a package of containers/requirements-runtime.txt: the tag hashes the whole lock")
    assert env_tag(lock) == env_tag(lock.replace(f"ruff=={ruff}", "ruff==0.0.1"))
    assert env_tag(lock) != env_tag(lock.replace(f"numpy=={numpy}", "numpy==1.0.0"))


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (Debian 12: apt-get install podman runc mmdebstrap; "
                    "scripts/setup.sh installs them when run as root)")
    reason = img.can_run()
    if reason:
        pytest.skip(f"podman cannot run containers on this machine: {reason}")
    lines: list[str] = []
    built = img.build(say=lines.append)
    print("\n".join(lines))
    return built["tag"]


@pytest.mark.slow
def test_the_image_trains_one_smoke_epoch_and_carries_only_what_training_needs(image, tmp_path):
    # One Python for both (each start imports torch): the distributions, and how Horovod was built.
    listing = ("dpkg-query -W -f '${Package}\\n' >/results/dpkg.txt"
               " && python -c 'import importlib.metadata as m, horovod.torch as hvd; "
               "print(*sorted(f\"{d.name}=={d.version}\" for d in m.distributions()), sep=chr(10)); "
               "print(hvd.mpi_built(), hvd.gloo_built(), hvd.nccl_built(), file=open(\"/results/horovod.txt\", \"w\"))'"
               " >/results/dists.txt")
    # One thread, as every training process the tests start (conftest.py): the container gets
    # none of the tests' environment unless passed.
    proc = podman.run(image, ["sh", "-c", f"{' '.join(img.SMOKE)} && {listing}"], tmp_path,
                      env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The run's record, read on the host: one epoch that learned something (chance: 90% error).
    (record,) = tmp_path.glob("*.jsonl")
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    epochs = [r for r in rows if r["type"] == "epoch"]
    assert len(epochs) == 1 and math.isfinite(epochs[0]["loss"]) and epochs[0]["val_top1_err"] < 80
    assert rows[-1]["type"] == "summary" and rows[-1]["completed_epochs"] == 1
    # Only what training needs: no Slurm, munge, Chromium, Node.js or compilers ...
    debian = set((tmp_path / "dpkg.txt").read_text().split())
    assert {"python3.11", "libopenmpi3"} <= debian
    assert not debian & set(NOT_DEBIAN), debian & set(NOT_DEBIAN)
    # ... no TensorFlow, book, test or installer packages, and every distribution at the lock's version.
    dists = dict(line.split("==", 1) for line in (tmp_path / "dists.txt").read_text().split())
    dists = {canonicalize_name(name): version for name, version in dists.items()}
    assert not dists.keys() & set(NOT_PYTHON), dists.keys() & set(NOT_PYTHON)
    lock = img.pins(REPO / "requirements.lock")
    assert dists.pop("horovod") == "0.28.1"  # the wheel scripts/setup.sh built for the venv
    assert {n: v for n, v in dists.items() if lock.get(n) != v} == {}
    assert img.pins(RUNTIME).keys() <= dists.keys()
    # exactly what the image's tag hashes: the runtime requirements and their locked dependencies
    closure = img.runtime_pins(REPO)
    assert closure is None or dists == closure, set(dists.items()) ^ set(closure.items())
    # Horovod's PyTorch ops import, built with MPI and Gloo (NCCL: only in a GPU variant, chapter 15).
    assert (tmp_path / "horovod.txt").read_text().split() == ["True", "True", "0"]


@pytest.mark.slow
def test_an_image_saves_as_the_docker_archive_apptainer_converts(image, tmp_path):
    """`podman save --format docker-archive` writes what `apptainer build guide.sif
    docker-archive://guide.tar` reads: a tar with manifest.json naming the image's config and
    layers. Saved here: the base image (170 MB, 1.5 s); the guide's image saves the same way
    (6.7 GB, about a minute on the CI VM: measured by hand, chapter 15)."""
    out = img.save(img.BASE, tmp_path / "base.tar")
    with tarfile.open(out) as tar:
        names = set(tar.getnames())
        (manifest,) = json.load(tar.extractfile("manifest.json"))
    assert manifest["Config"] in names and manifest["Layers"] and set(manifest["Layers"]) <= names
    assert manifest["RepoTags"] == [img.BASE]
    # an archive already there is the user's: refused in one line, left as it was
    before = out.stat().st_mtime_ns
    again = subprocess.run([sys.executable, "-m", "guide_utils", "image", "save", str(out)], capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 2 and "exists" in again.stderr and "Traceback" not in again.stderr, again.stderr
    assert out.stat().st_mtime_ns == before
