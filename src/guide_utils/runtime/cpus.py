"""The CPUs a rank has, and what the engine does with them by default (no framework imported:
the doctor uses it too)."""

from __future__ import annotations

import os


def affinity() -> list[int]:
    """The CPUs this process may run on (its affinity; every CPU where it cannot be read)."""
    getaffinity = getattr(os, "sched_getaffinity", None)  # Linux only
    return sorted(getaffinity(0)) if getaffinity else list(range(os.cpu_count() or 1))


def default_loader_workers(device_type: str, cpus: int | None = None) -> int:
    """``--loader-workers auto``: on a GPU, the CPUs this rank can count on less one for the
    rank's own process, at most 16; on a CPU, 4 (the compute needs the cores there).

    ``cpus``: the rank's share of its node's CPUs (``Launcher.cpu_share``: its own where the
    launcher binds each rank, else the set it shares divided among the node's ranks); by
    default every CPU this process may run on.

    >>> default_loader_workers("cuda", 16), default_loader_workers("cuda", 7), default_loader_workers("cuda", 64)
    (15, 6, 16)
    >>> default_loader_workers("cuda", 1), default_loader_workers("cpu", 64)
    (1, 4)
    """
    if device_type != "cuda":
        return 4
    cpus = len(affinity()) if cpus is None else cpus
    return max(1, min(16, cpus - 1))
