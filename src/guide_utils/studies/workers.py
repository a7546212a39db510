"""Training a study's points: each through the engine, in this process or in fresh worker
processes with a fixed number of CPU threads, several at a time.

Why thread counts are fixed: on a CPU the number of threads decides the order in which a
convolution's partial sums are added, and at a learning rate near the edge of stability (the
linear rule's 1.6 at k = 32) that last-bit difference can send one run down another path. A
result the guide states must hold at more than one setting, so a study trains each point at
every thread count it is given and records the count with the run.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Callable, Iterable, Sequence

from ..core.errors import GuideError


def set_threads(threads: int) -> None:
    """Pin this process to ``threads`` CPU threads (the engine keeps an OMP_NUM_THREADS it finds)."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


def check_threads(threads: Iterable[int], jobs: int) -> list[int]:
    threads, cores = list(threads), os.cpu_count() or 1
    if not threads or any(t < 1 for t in threads):
        raise GuideError(f"--threads takes one or more counts of 1 or more, got {threads}")
    if not 1 <= jobs <= cores:
        raise GuideError(f"--jobs must be 1 to {cores} (the cores of this machine), got {jobs}")
    return threads


def train_point(point, row: Callable, **overrides) -> dict:
    """Train ``point`` through the engine in this process: ``row(point, cfg, result)`` plus
    what every study records of a run, its thread count and CPU time. ``point.config(**overrides)``
    makes its ``TrainConfig``."""
    import torch

    from ..engine import train

    cfg = point.config(**overrides)
    cpu = time.process_time()
    result = train(cfg)
    measured = {"threads": torch.get_num_threads(), "cpu_seconds": round(time.process_time() - cpu, 1)}
    return {**measured, **row(point, cfg, result)}


def train_all(tasks: Sequence, run: Callable, threads: int, jobs: int, report: Callable, **kwargs) -> None:
    """``run(task, **kwargs)`` for every task, each in a worker process with ``threads`` threads,
    ``max(1, jobs // threads)`` at a time; ``report(row)`` as each finishes (in finishing order).
    Workers are spawned, not forked: each starts with its own thread pool and imports."""
    if not tasks:
        return
    workers = max(1, min(len(tasks), jobs // threads))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=set_threads, initargs=(threads,)) as pool:
        for fut in as_completed([pool.submit(run, t, **kwargs) for t in tasks]):
            report(fut.result())


def train_here(tasks: Sequence, run: Callable, report: Callable, **kwargs) -> None:
    """``run(task, **kwargs)`` for every task in this process, one after another, at the thread
    count the launcher gave it (a multi-worker run is one of several processes a launcher started)."""
    for task in tasks:
        report(run(task, **kwargs))
