"""Podman as the guide calls it: the podman on the PATH, the flags every call takes, a failed
call as one line, and the images its store holds (:mod:`.image` builds and runs the guide's
image with it).

What podman needs on a machine like the CI VM (rootful, no systemd; podman picks cgroupfs
and the file events logger by itself there), passed on every call rather than written into
``/etc/containers``: ``runc`` (Debian 12's crun 1.8.1 refuses hybrid cgroups v1/v2, "drop all
controllers from cgroupv2"), and resource limits no higher than this process's own, since
podman's defaults (1048576 open files) need CAP_SYS_RESOURCE, which the VM does not grant.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
from pathlib import Path

from ..core.errors import GuideError


def executable() -> str:
    """The podman on the PATH, or a GuideError saying how to get it."""
    path = shutil.which("podman")
    if path is None:
        raise GuideError("podman not found: install it (Debian 12: apt-get install podman runc mmdebstrap; "
                         "scripts/setup.sh does when run as root)")
    return path


def global_flags() -> list[str]:
    """podman's own flags: runc where it is installed (see the module's docstring)."""
    return ["--runtime", "runc"] if shutil.which("runc") else []


def limits() -> list[str]:
    """``--ulimit`` flags no higher than this process may set: its hard limits, and for
    processes at most the kernel's pid_max (above 32768, pid_max on the CI VM, runc's
    setrlimit fails there even below the hard limit)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        pid_max = 32768
    nproc = pid_max if nproc == resource.RLIM_INFINITY else min(nproc, pid_max)
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else nofile
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def run_flags() -> list[str]:
    """What every ``podman run`` and ``podman build`` of the guide takes: the limits and the
    host's network (no bridge, no firewall rules: the CI VM has neither netavark nor iptables)."""
    return ["--network=host", *limits()]


def podman(*args: str, check: bool = True, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    """``podman ARGS`` with the guide's flags; a GuideError with podman's last line when it fails
    (unless ``check`` is false), or when it takes longer than ``timeout`` seconds."""
    try:
        proc = subprocess.run([executable(), *global_flags(), *args], capture_output=True, text=True, timeout=timeout,
                              **kwargs)
    except subprocess.TimeoutExpired:
        raise GuideError(f"podman {args[0]} did not finish in {timeout:.0f} s") from None
    if check and proc.returncode != 0:
        raise GuideError(f"podman {args[0]} failed: {last_line(proc.stderr)}")
    return proc


def last_line(text: str) -> str:
    """The last line of ``text`` that is not blank: a failed command's reason."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no message)"


def exists(tag: str) -> bool:
    """Whether this machine's podman store has the image ``tag``."""
    return podman("image", "exists", tag, check=False).returncode == 0


def image_id(tag: str) -> str:
    """The image's id (``sha256:...``): what a tag built on it depends on."""
    return podman("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()


def image_size(tag: str) -> int:
    """The image's size in bytes (all layers, as ``podman images`` counts them)."""
    return int(podman("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())


def run(tag: str, command: list[str], results: Path | None = None, timeout: float = 900,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``command`` in a fresh container of ``tag`` (which gets none of this environment but
    ``env``); ``results`` (on the host) is /results inside."""
    mounts = ["-v", f"{results}:/results"] if results else []
    envs = [f"--env={k}={v}" for k, v in (env or {}).items()]
    return podman("run", "--rm", *run_flags(), *mounts, *envs, tag, *command, check=False, timeout=timeout)
