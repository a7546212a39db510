"""The allreduce over message sizes, as nccl-tests measures and reports it.

``time_s`` is the slowest rank's mean over the timed iterations (a collective is done when
its last rank is), ``cpu_s`` the CPU time the process spent per allreduce; ``algbw`` and
``busbw`` are nccl-tests' bandwidths (NVIDIA/nccl-tests, doc/PERFORMANCE.md). The timing
and the row format are shared with the gradient-list measurements (``gradients``).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ...core.errors import GuideError
from .runtimes import MIB, Comm
from ..units import human_bytes  # noqa: F401 - in the doctest of sizes()


def algbw(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: size / time (nccl-tests)."""
    return size_bytes / seconds / 1e9


def busbw(algbw_gbps: float, workers: int) -> float:
    """Bus bandwidth of an allreduce in GB/s: algbw x 2(n-1)/n (nccl-tests' correction factor)."""
    return algbw_gbps * 2 * (workers - 1) / workers


def sizes(min_bytes: int = 4, max_bytes: int = 256 * MIB, factor: int = 4) -> list[int]:
    """Message sizes from ``min_bytes`` to ``max_bytes`` (both included), ``factor`` apart,
    rounded to whole float32 elements.

    >>> [human_bytes(s) for s in sizes(4, 64, 4)]
    ['4 B', '16 B', '64 B']
    """
    if factor < 2:
        raise GuideError(f"--factor must be 2 or more, got {factor}")
    if min_bytes > max_bytes:
        raise GuideError(f"--min-bytes {min_bytes} is larger than --max-bytes {max_bytes}")
    out, s = [], max(4, min_bytes - min_bytes % 4)
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def iterations(size_bytes: int, budget_bytes: int, most: int = 50, least: int = 3) -> int:
    """Timed iterations for one size: enough to average out small-message jitter, few for
    the large ones (their time is long and steady); ``budget_bytes`` moved per size.

    >>> iterations(4, 2**28), iterations(2**28, 2**28)
    (50, 3)
    """
    return max(least, min(most, budget_bytes // max(size_bytes, 1)))


# -- timing a collective ----------------------------------------------------------------------

def _cpu_seconds() -> float:
    """CPU time of this whole process so far (every thread: the framework's communication
    threads and the kernel's work for its sockets included)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(comm: Comm, fn: Callable[[], Any], iters: int, warmup: int = 1) -> tuple[float, float]:
    """Mean wall seconds and CPU seconds per call of ``fn`` after ``warmup`` calls; the
    slowest rank's of each."""
    for _ in range(warmup):
        fn()
    comm.barrier()
    start, cpu = time.perf_counter(), _cpu_seconds()
    for _ in range(iters):
        out = fn()
    if comm.device().type == "cuda":
        import torch

        torch.cuda.synchronize()
    wall, cpu = (time.perf_counter() - start) / iters, (_cpu_seconds() - cpu) / iters
    del out
    return comm.gather_max(wall), comm.gather_max(cpu)


def result_row(comm: Comm, kind: str, size_bytes: int, timing: tuple[float, float], **fields) -> dict[str, Any]:
    """One JSON row of a measurement: ``timing`` (wall, CPU seconds) of ``size_bytes`` on ``comm``."""
    seconds, cpu = timing
    a = algbw(size_bytes, seconds)
    return {"kind": kind, "runtime": comm.label, "workers": comm.size, "bytes": size_bytes, "time_s": seconds,
            "algbw_GBps": a, "busbw_GBps": busbw(a, comm.size), "cpu_s": cpu, **fields}


def measure_sizes(comm: Comm, message_sizes: list[int], *, budget_bytes: int = 512 * MIB,
                  fp16: bool = False) -> list[dict[str, Any]]:
    """One allreduce of a float32 tensor per size: time, algbw and busbw; each result is
    checked (every rank contributes rank+1, so the sum is n(n+1)/2 everywhere)."""
    import torch

    rows = []
    expected = comm.size * (comm.size + 1) / 2
    for s in message_sizes:
        t = torch.full((s // 4,), float(comm.rank + 1), device=comm.device())
        name = f"sweep.{s}"
        wrong = comm.gather_max(0.0 if bool(torch.all(comm.allreduce(t, name, fp16) == expected)) else 1.0)
        iters = iterations(s, budget_bytes)
        timing = timed(comm, lambda: comm.allreduce(t, name, fp16), iters, warmup=1 if s >= 16 * MIB else 3)
        rows.append(result_row(comm, "allreduce", s, timing, dtype="float32",
                               compression="fp16" if fp16 else "none", iters=iters, correct=wrong == 0))
        del t
    return rows
