"""The guide's Apptainer image (``containers/guide.def``) and the site profile that runs the
sbatch examples through it (``slurm_examples/sites/apptainer-example.sh``): reading them,
and measuring what a container saves at start-up (chapter 15).

>>> sections("Bootstrap: docker\\nFrom: debian:12\\n%post\\n    # set up\\n    make\\n")
{'header': ['Bootstrap: docker', 'From: debian:12'], 'post': ['make']}
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..core.paths import repo_path, repo_root

# The repository's files, found when first used (a wheel install has no repository:
# importing this module must still work). REPO, DEFINITION and PROFILE read as constants.
_FILES = {"REPO": repo_root, "DEFINITION": lambda: repo_path("containers", "guide.def"),
          "PROFILE": lambda: repo_path("slurm_examples", "sites", "apptainer-example.sh")}


def __getattr__(name: str) -> Path:
    if name in _FILES:
        return _FILES[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def sections(text: str) -> dict[str, list[str]]:
    """An Apptainer definition file's header and ``%sections``, as lists of non-comment lines."""
    out: dict[str, list[str]] = {"header": []}
    current = "header"
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("%"):
            current = stripped[1:].split()[0]
            out[current] = []
        elif stripped and not stripped.startswith("#"):
            out[current].append(stripped)
    return out


def runtime() -> str | None:
    """The Apptainer (or SingularityCE) on the PATH, or None."""
    return shutil.which("apptainer") or shutil.which("singularity")


def exec_prefix(profile: Path | None = None, *, local_scratch: str = "/local/scratch") -> list[str]:
    """What a job with ``profile`` puts before every command that needs the guide's stack:
    ``apptainer exec FLAGS NET SRC IMAGE`` (the profile read by bash, with ``$LOCAL_SCRATCH`` set;
    NET: the binds of the host's network libraries, ``GUIDE_APPTAINER_NET_LIBS``, as
    ``lib/guide.sh`` makes them; SRC: the checkout's ``src`` over the image's copy), after
    ``slurm_examples/lib/apptainer_env.sh`` when FLAGS has ``--cleanenv``
    (as ``lib/guide.sh`` does: it passes the variables srun and the job set into the image);
    ``profile`` defaults to the repository's ``apptainer-example.sh``."""
    profile = profile or _FILES["PROFILE"]()
    guide_sh = repo_path("slurm_examples", "lib", "guide.sh")
    code = (f'source "{guide_sh}"; GUIDE_SITE_FILE="{profile}"; source "{profile}"; guide_apptainer_net_flags; '
            "printf '%s\\n' \"$GUIDE_CONTAINER\" \"$GUIDE_IMAGE_SRC\" \"${#GUIDE_APPTAINER_FLAGS[@]}\" "
            "\"${GUIDE_APPTAINER_FLAGS[@]}\" ${GUIDE_NET_FLAGS[@]+\"${GUIDE_NET_FLAGS[@]}\"}")
    out = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=30, check=True,
                         env={**os.environ, "LOCAL_SCRATCH": local_scratch})
    container, image_src, count, *rest = out.stdout.splitlines()
    flags, net = rest[:int(count)], rest[int(count):]
    clean = {"--cleanenv", "-e"} & set(flags)
    env = [str(repo_path("slurm_examples", "lib", "apptainer_env.sh"))] if clean else []
    src = ["-B", f"{repo_path('src')}:{image_src}:ro"]  # the checkout's guide_utils, as lib/guide.sh binds it
    return [*env, "apptainer", "exec", *flags, *net, *src, container]


def import_footprint(modules: tuple[str, ...] = ("torch", "torchvision", "timm", "guide_utils.engine")) -> dict:
    """What starting the training costs a Python process before it computes anything: the
    modules it imports and how long that takes (in a fresh interpreter), and how many files
    the environment they come from holds. On a parallel filesystem every rank of a job
    looks those files up; in an image they are one file per node."""
    code = ("import sys, time; t = time.perf_counter(); "
            + "; ".join(f"import {m}" for m in modules)
            + "; print(len(sys.modules), time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
    loaded, seconds = out.stdout.split()
    prefix = Path(sys.prefix)
    files = size = 0
    start = time.perf_counter()
    for root, _, names in os.walk(prefix / "lib"):
        for name in names:
            files += 1
            try:
                size += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return {"modules": int(loaded), "import_seconds": round(float(seconds), 2), "env_files": files,
            "env_gib": round(size / 2**30, 2), "walk_seconds": round(time.perf_counter() - start, 2),
            "environment": str(prefix)}
