"""What made a recorded result: when, on what machine, from which commit, with which stack.

Every recorded result carries it, in one of two forms: a study's CSV (``studies.study_csv``)
as its first line, a measurement of ``perf`` (``perf.record``) as the JSON object on its
first line. Both are built here, from one :class:`Provenance` collected once per file, so
that they cannot drift apart: the same commit rule (marked when the checkout has
uncommitted changes), the same hardware label, the same clock.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..core.paths import package_dir

# The packages whose versions a study's CSV states (the study's numbers depend on them).
STUDY_PACKAGES = ("torch", "timm", "mnist1d", "numpy")


def cpu_isa() -> str:
    """The widest vector instruction set of this CPU that the math libraries use (x86), and the
    cap on it where ``ONEDNN_MAX_CPU_ISA`` or ``MKL_ENABLE_INSTRUCTIONS`` sets one."""
    try:
        flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), [])
    except OSError:
        flags = []
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else platform.machine()
    caps = [f"{v}={os.environ[v]}" for v in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS") if os.environ.get(v)]
    return isa + (f" (capped: {', '.join(caps)})" if caps else "")


def commit() -> str:
    """The checkout's commit, marked when it has uncommitted changes; 'unknown' outside git."""
    here = str(package_dir())
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        head, dirty = "", ""
    return (head + (" with uncommitted changes" if dirty else "")) if head else "unknown (not a git checkout)"


def version(package: str) -> str | None:
    """The installed distribution's version (``importlib.metadata``), None when it is absent."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(package)
    except PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Provenance:
    """The facts, collected once (:meth:`collect`); :meth:`line` and :meth:`record` are its two forms."""

    now: _dt.datetime  # local time, with its zone
    host: str
    hardware: str  # ``results.plots.hardware_label``: CPU, cores, GPU
    commit: str
    python: str
    versions: dict[str, str | None] = field(default_factory=dict)  # of the distributions asked for

    @classmethod
    def collect(cls, packages: Sequence[str] = STUDY_PACKAGES) -> Provenance:
        from .plots import hardware_label

        return cls(now=_dt.datetime.now().astimezone(), host=platform.node(), hardware=hardware_label(),
                   commit=commit(), python=platform.python_version(), versions={p: version(p) for p in packages})

    def line(self, title: str, command: str, *, threads: Sequence[int], jobs: int) -> str:
        """A study CSV's first line: what made it (``title``, ``command``), when, on what, how
        (thread counts, cores busy), from which commit and with which stack."""
        versions = ", ".join(f"{p} {v}" for p, v in self.versions.items())
        counts = " and ".join(str(t) for t in threads)
        return (f"{title} ({command}); measured {self.now.date().isoformat()} on {self.hardware}, "
                f"{cpu_isa()}; {counts} thread(s) per run, up to {jobs} core(s) busy; commit {self.commit}; "
                f"Python {self.python}, {versions}")

    def record(self, **extra: Any) -> dict[str, Any]:
        """A recorded measurement's first JSON object: the date (UTC), host, hardware, the load
        now, commit, Python, the PyTorch build (``torch.__version__``, with its CUDA or CPU tag)
        and Horovod's version (None without it), then ``extra``."""
        import torch

        when = self.now.astimezone(_dt.timezone.utc).isoformat(timespec="seconds")
        return {"kind": "provenance", "date": when, "host": self.host, "hardware": self.hardware,
                "load_avg_1min": round(os.getloadavg()[0], 2), "commit": self.commit, "python": self.python,
                "torch": torch.__version__, "horovod": self.versions.get("horovod"), **extra}


def line(title: str, command: str, *, threads: Sequence[int], jobs: int) -> str:
    """A study CSV's first line, collected now (:meth:`Provenance.line`)."""
    return Provenance.collect().line(title, command, threads=threads, jobs=jobs)


def record(**extra: Any) -> dict[str, Any]:
    """A recorded measurement's first JSON object, collected now (:meth:`Provenance.record`)."""
    return Provenance.collect(("horovod",)).record(**extra)
