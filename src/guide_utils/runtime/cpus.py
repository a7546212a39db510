"""The CPUs a rank has, and what the engine does with them by default (no framework imported:
the doctor uses it too)."""

from __future__ import annotations

import os


def affinity() -> list[int]:
    """The CPUs this process may run on (its affinity; every CPU where it cannot be read)."""
    getaffinity = getattr(os, "sched_getaffinity", None)  # Linux only
    return sorted(getaffinity(0)) if getaffinity else list(range(os.cpu_count() or 1))


def default_loader_workers(local_ranks: int, device_type: str, *, cpus: int | None = None,
                           node_cpus: int | None = None) -> int:
    """``--loader-workers auto``: on a GPU, the CPUs this rank has less one for the rank's
    own process, at most 16; on a CPU, 4 (the compute needs the cores there).

    A rank's CPUs: its affinity mask when the launcher bound it to fewer than the node's
    CPUs (Slurm's ``--cpus-per-task`` binding), else the node's CPUs shared by the ranks on
    the node (torchrun starts every rank on all of them).

    >>> default_loader_workers(1, "cuda", cpus=16, node_cpus=16)
    15
    >>> default_loader_workers(4, "cuda", cpus=16, node_cpus=16)
    3
    >>> default_loader_workers(4, "cuda", cpus=8, node_cpus=64), default_loader_workers(1, "cpu", cpus=64)
    (7, 4)
    """
    if device_type != "cuda":
        return 4
    node_cpus = node_cpus or os.cpu_count() or 1
    cpus = len(affinity()) if cpus is None else cpus
    share = cpus if cpus < node_cpus else cpus // max(1, local_ranks)
    return max(1, min(16, share - 1))
