"""Distributed-training pitfalls 1 to 7 reproduced at laptop scale (chapter 14; 8 and 9 need GPUs).

Every function here shows one symptom as a user would meet it, small enough to run in a
notebook cell in seconds: the same sample order every epoch, a collective that waits for a
rank that never calls it, a rendezvous port another job already holds, the learning rate
scaled twice, BatchNorm statistics of a small per-worker batch. The fixes live in the
engine (``guide_utils.engine``), the launch lines of ``slurm_examples/`` and the doctor;
the chapter links each pitfall to the cell or test that shows both.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from ..runtime.ports import free_port


def sampler_orders(*, set_epoch: bool, epochs: int = 3, samples: int = 12, replicas: int = 2, rank: int = 0,
                   seed: int = 0) -> list[list[int]]:
    """The indices rank ``rank`` of ``replicas`` draws in each epoch from a shuffling
    ``DistributedSampler``, calling ``set_epoch(e)`` before epoch ``e`` or not."""
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(samples), num_replicas=replicas, rank=rank, shuffle=True, seed=seed)
    orders = []
    for epoch in range(epochs):
        if set_epoch:
            sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders


def _uneven_worker(rank: int, world: int, port: int, calls: int, timeout_s: float, idle_s: float, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=_dt.timedelta(seconds=timeout_s))
    start = time.perf_counter()
    try:
        for _ in range(calls):
            dist.all_reduce(torch.ones(8))  # one optimizer step's gradient average
        outcome = "finished its steps"
        time.sleep(idle_s)  # busy elsewhere (its validation, its next epoch), but alive
    except RuntimeError as exc:
        message = str(exc).strip().splitlines()[0]
        if message.startswith("[") and "] " in message:  # drop the C++ source location
            message = message.split("] ", 1)[1]
        outcome = f"{type(exc).__name__}: {message[:160]}"
    queue.put({"rank": rank, "steps": calls, "outcome": outcome, "seconds": round(time.perf_counter() - start, 1)})


def uneven_steps(steps: Sequence[int] = (3, 4), *, timeout_s: float = 3.0) -> list[dict[str, Any]]:
    """Two Gloo processes in which rank r takes ``steps[r]`` optimizer steps (one gradient
    allreduce each) with a process-group timeout of ``timeout_s`` seconds: what each saw.

    The rank with more steps waits in an allreduce its peer never joins. Here the wait ends
    after ``timeout_s``; with PyTorch's default (30 minutes for Gloo, 10 for NCCL) or under
    Horovod (no timeout: it prints stall warnings for ever) the job simply hangs.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    idle = timeout_s + 2  # the short rank stays alive past the other's timeout
    procs = [ctx.Process(target=_uneven_worker, args=(r, len(steps), port, n, timeout_s, idle, queue))
             for r, n in enumerate(steps)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120 + idle) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    return sorted(results, key=lambda r: r["rank"])


def launch_per_rank(args_per_rank: Sequence[Sequence[str]], *, timeout: float = 300) -> list[dict[str, Any]]:
    """Start ``python -m guide_utils.train`` once per rank with that rank's own arguments,
    as torchrun would (``RANK``/``WORLD_SIZE`` and a rendezvous on this machine), and wait.
    Each rank's exit status, its last line of error output and its wall time."""
    port, world = free_port(), len(args_per_rank)
    start, procs = time.perf_counter(), []
    for rank, args in enumerate(args_per_rank):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        procs.append(subprocess.Popen([sys.executable, "-m", "guide_utils.train", *args], env=env, text=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    out = []
    for rank, proc in enumerate(procs):
        try:
            _, err = proc.communicate(timeout=max(1.0, timeout - (time.perf_counter() - start)))
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            err += f"\nstill running after {timeout:.0f} s: killed"
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        out.append({"rank": rank, "returncode": proc.returncode, "last_error_line": lines[-1] if lines else "",
                    "seconds": round(time.perf_counter() - start, 1)})
    return out


def port_collision() -> str:
    """Hold a port as another job's rendezvous on the same node would, then start a
    rendezvous server on the same port: the error the second job's rank 0 gets."""
    from torch.distributed import TCPStore

    with socket.socket() as other_job:
        other_job.bind(("127.0.0.1", 0))
        other_job.listen()
        port = other_job.getsockname()[1]
        try:
            TCPStore("127.0.0.1", port, world_size=2, is_master=True, timeout=_dt.timedelta(seconds=5),
                     wait_for_workers=False)
        except Exception as exc:  # noqa: BLE001 - whatever the rendezvous raises is the symptom shown
            return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    return "no error"


def batchnorm_spread(per_worker_batches: Sequence[int], *, global_batch: int = 1024, seed: int = 0,
                     samples: int = 4000) -> list[dict[str, float]]:
    """How far the batch means each worker's BatchNorm normalises with stray from the global
    batch's, for several per-worker batch sizes: the first layer's activations of MNIST-1D's
    CNN at initialisation, ``global_batch`` samples split over ``global_batch // b`` workers.
    Returns, per ``b``: workers, and the mean absolute deviation of the per-worker channel
    means from the global ones, relative to the channels' standard deviation."""
    import torch

    from ..data.loaders import build_data
    from ..engine.models import mnist1d_cnn

    data = build_data("mnist1d", mnist1d_samples=samples, seed=seed)
    x = torch.stack([data.train[i][0] for i in range(global_batch)])
    torch.manual_seed(seed)
    conv = mnist1d_cnn(10)[0]  # the first convolution, whose output the first BatchNorm sees
    with torch.no_grad():
        h = conv(x)  # (batch, channels, length)
    mean, std = h.mean(dim=(0, 2)), h.std(dim=(0, 2))
    rows = []
    for b in per_worker_batches:
        shards = h.split(b)
        dev = torch.stack([((s.mean(dim=(0, 2)) - mean).abs() / std) for s in shards]).mean()
        rows.append({"per_worker_batch": b, "workers": len(shards), "relative_deviation": round(float(dev), 4)})
    return rows


def lr_scaling_cases(k: int = 16, *, epochs: int = 1, results_dir: str | Path, base_lr: float = 0.05,
                     base_batch: int = 32, samples: int = 4000, seed: int = 0) -> list[dict[str, Any]]:
    """The same k-fold global batch trained three ways: the learning rate not scaled, scaled
    once by the linear rule, and scaled twice (a base rate already multiplied by k handed to
    code that multiplies by k again, e.g. ``lr * hvd.size()`` on top of the rule). Each row:
    the case, the peak learning rate the run plan printed, and the run's last losses and
    validation error."""
    from ..core.config import make_config
    from ..engine import train
    from ..engine.plan import RunPlan

    cases = {"not scaled": ("none", base_lr), "scaled once (linear rule)": ("linear", base_lr),
             "scaled twice": ("linear", base_lr * k)}
    rows = []
    for case, (rule, lr) in cases.items():
        cfg = make_config("smoke", mnist1d_samples=samples, epochs=epochs, milestones=(epochs + 1,), seed=seed,
                          per_worker_batch=base_batch * k, base_lr=lr, base_batch=base_batch, lr_scaling=rule,
                          results_dir=str(results_dir), run_name=f"pitfall-lr-{rule}-{lr:g}", progress=False,
                          quiet=True)
        peak = RunPlan.make(cfg, workers=1, samples_per_worker=samples).peak_lr
        epochs_out = train(cfg).epochs
        rows.append({"case": case, "peak_lr": round(peak, 4), "train_loss": round(epochs_out[-1]["loss"], 3),
                     "val_top1_err": round(epochs_out[-1]["val_top1_err"], 2)})
    return rows
