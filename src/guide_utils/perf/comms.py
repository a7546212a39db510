"""``python -m guide_utils comms``: how fast can these workers average gradients?

Times an allreduce over message sizes (4 B to 256 MiB by default) for each runtime the stack
has, Horovod over Gloo and over MPI, ``torch.distributed`` over Gloo, MPI (where PyTorch was
built with it) and NCCL (GPUs), and reports what nccl-tests reports (NVIDIA/nccl-tests,
doc/PERFORMANCE.md):

* ``time_s``: seconds per allreduce, the mean of the timed iterations on each rank, then
  the slowest rank (a collective is done when its last rank is); ``cpu_s``: the CPU time
  the process spent per allreduce (all its threads, the kernel's socket work included),
  which on a machine without a network card of its own is taken from the computation;
* ``algbw`` = size / time, in GB/s (10^9 bytes per second);
* ``busbw`` = algbw x 2(n-1)/n for an allreduce: what each rank's link must carry, so that
  it can be compared with the hardware's bandwidth independently of the worker count n.

Then the knobs that decide how a training step's gradients travel, on a real model's
gradient list (ResNet-50's 161 tensors, 25.6 M parameters, by default): one allreduce per
tensor versus one fused buffer, Horovod's tensor fusion (threshold and cycle time) and fp16
compression, and DDP's bucket size (real ``DistributedDataParallel`` on a stand-in module
with the same parameter shapes and almost no arithmetic).

Run it without a launcher and it starts the workers on this machine itself (2 by default,
with ``horovodrun``, ``mpirun`` or ``torchrun``); run it under a launcher (``srun``,
``mpirun``, ``horovodrun``, ``torchrun``) and every process is one worker, as in
``slurm_examples/10_communication.sbatch``. Results are JSON lines (``--json`` or
``--out FILE``); rank 0 writes them.

>>> round(busbw(algbw(1e9, 0.5), workers=4), 3)
3.0
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..core.cli import ArgumentParser, one_line_errors
from ..core.errors import GuideError
from .units import human_bytes, parse_bytes

PROG = "python -m guide_utils comms"
MIB = 2**20


@dataclass(frozen=True)
class Runtime:
    name: str
    framework: str  # "horovod" or "torch"
    backend: str  # "gloo", "mpi" or "nccl"
    launcher: str  # how this machine starts it locally


RUNTIMES = {r.name: r for r in (
    Runtime("horovod-gloo", "horovod", "gloo", "horovodrun"),
    Runtime("horovod-mpi", "horovod", "mpi", "mpirun"),
    Runtime("torch-gloo", "torch", "gloo", "torchrun"),
    Runtime("torch-mpi", "torch", "mpi", "mpirun"),
    Runtime("torch-nccl", "torch", "nccl", "torchrun"),
)}
# Horovod's tensor-fusion settings tried by --knobs, (threshold MiB, cycle time ms); Horovod
# 0.28.1's defaults are 128 MiB and 1 ms (horovod/common/operations.cc).
HOROVOD_DEFAULTS = (128, 1.0)
HOROVOD_GRID = ((0, 1.0), (1, 1.0), (8, 1.0), (32, 1.0), (128, 1.0), (128, 5.0), (128, 20.0))
DDP_BUCKETS_MB = (1, 5, 25, 100)  # 25: DDP's default bucket_cap_mb
METHODS = ("one-by-one", "async-all", "async-all-fp16", "one-buffer")


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


# -- the workers' side: one object per runtime with the same few operations -----------------

class _Comm:
    """What the measurements need of a runtime: rank, size, allreduce (one tensor, many, or
    with fp16 compression), barrier and the max of a number over ranks."""

    rank = 0
    size = 1
    label = ""

    def device(self):
        import torch

        return torch.device("cpu")


class _HorovodComm(_Comm):
    def __init__(self, requested: str):
        from ..engine import distributed

        self.dist = distributed.init("horovod")
        self.hvd = hvd = self.dist._hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        backend = "mpi" if hvd.mpi_enabled() else "gloo"
        self.label = f"horovod-{backend}"
        if requested not in ("horovod", self.label):
            hvd.shutdown()
            raise GuideError(f"--runtime {requested} but this launcher gave Horovod {backend.upper()}; start "
                             f"horovod-gloo with horovodrun --gloo, horovod-mpi with mpirun or srun --mpi=pmix")
        self.cycle_ms = float(os.environ.get("HOROVOD_CYCLE_TIME", HOROVOD_DEFAULTS[1]))
        self.fusion_bytes = int(os.environ.get("HOROVOD_FUSION_THRESHOLD", HOROVOD_DEFAULTS[0] * MIB))

    def allreduce(self, t, name: str, fp16: bool = False):
        c = self.hvd.Compression.fp16 if fp16 else self.hvd.Compression.none
        return self.hvd.allreduce(t, op=self.hvd.Sum, name=name, compression=c)

    def allreduce_list(self, tensors, fp16: bool = False):
        """As DistributedOptimizer does: every gradient submitted asynchronously, then waited
        for; Horovod's background thread fuses what is ready into buffers of the threshold."""
        c = self.hvd.Compression.fp16 if fp16 else self.hvd.Compression.none
        pending = []
        for i, t in enumerate(tensors):
            ct, ctx = c.compress(t)
            pending.append((self.hvd.allreduce_async_(ct, op=self.hvd.Sum, name=f"grad.{i}"), ctx))
        return [c.decompress(self.hvd.synchronize(h), ctx) for h, ctx in pending]

    def allreduce_one_by_one(self, tensors):
        return [self.hvd.allreduce(t, op=self.hvd.Sum, name=f"grad1.{i}") for i, t in enumerate(tensors)]

    def barrier(self):
        self.hvd.barrier()

    def gather_max(self, x: float) -> float:
        return max(self.hvd.allgather_object(x))

    def shutdown(self):
        self.hvd.shutdown()


class _TorchComm(_Comm):
    def __init__(self, backend: str):
        import torch
        import torch.distributed as tdist

        from ..runtime.launch import require_launcher

        launcher, job = require_launcher("ddp")
        if launcher != "torchrun":  # srun without torchrun: rank and rendezvous from the Slurm step
            os.environ.update({k: v for k, v in job.torch_distributed_env().items() if k not in os.environ})
        self._device = torch.device("cpu")
        if backend == "nccl":
            local = int(os.environ.get("LOCAL_RANK", 0))
            torch.cuda.set_device(local)
            self._device = torch.device("cuda", local)
        tdist.init_process_group(backend=backend)
        self.tdist, self.torch = tdist, torch
        self.rank, self.size = tdist.get_rank(), tdist.get_world_size()
        self.label = f"torch-{backend}"

    def device(self):
        return self._device

    def allreduce(self, t, name: str, fp16: bool = False):
        out = t.half() if fp16 else t.clone()
        self.tdist.all_reduce(out)
        return out.float() if fp16 else out

    def allreduce_list(self, tensors, fp16: bool = False):
        """Every tensor asynchronously, then wait: no fusion, one collective per tensor."""
        outs = [t.half() if fp16 else t.clone() for t in tensors]
        for work in [self.tdist.all_reduce(o, async_op=True) for o in outs]:
            work.wait()
        return [o.float() for o in outs] if fp16 else outs

    def allreduce_one_by_one(self, tensors):
        return [self.allreduce(t, "") for t in tensors]

    def barrier(self):
        if self._device.type == "cuda":
            self.torch.cuda.synchronize()
        self.tdist.barrier()

    def gather_max(self, x: float) -> float:
        out = [None] * self.size
        self.tdist.all_gather_object(out, x)
        return max(out)

    def shutdown(self):
        self.tdist.destroy_process_group()


def connect(runtime: str) -> _Comm:
    """Join the job this launcher started, with ``runtime`` (``horovod`` takes whichever
    controller the launcher gave)."""
    if runtime.startswith("horovod"):
        return _HorovodComm(runtime)
    if runtime in ("torch-gloo", "torch-mpi", "torch-nccl"):
        reason = unavailable(runtime, workers=1, launching=False)
        if reason:
            raise GuideError(f"--runtime {runtime}: {reason}")
        return _TorchComm(runtime.split("-", 1)[1])
    raise GuideError(f"unknown --runtime {runtime!r}; choose from horovod, {', '.join(RUNTIMES)}")


def _cpu_seconds() -> float:
    """CPU time of this whole process so far (every thread: the framework's communication
    threads and the kernel's work for its sockets included)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(comm: _Comm, fn: Callable[[], Any], iters: int, warmup: int = 1) -> tuple[float, float]:
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


def _row(comm: _Comm, kind: str, size_bytes: int, timing: tuple[float, float], **fields) -> dict[str, Any]:
    seconds, cpu = timing
    a = algbw(size_bytes, seconds)
    return {"kind": kind, "runtime": comm.label, "workers": comm.size, "bytes": size_bytes, "time_s": seconds,
            "algbw_GBps": a, "busbw_GBps": busbw(a, comm.size), "cpu_s": cpu, **fields}


def measure_sizes(comm: _Comm, message_sizes: list[int], *, budget_bytes: int = 512 * MIB,
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
        timing = _timed(comm, lambda: comm.allreduce(t, name, fp16), iters, warmup=1 if s >= 16 * MIB else 3)
        rows.append(_row(comm, "allreduce", s, timing, dtype="float32", compression="fp16" if fp16 else "none",
                         iters=iters, correct=wrong == 0))
        del t
    return rows


# -- a real model's gradient list -------------------------------------------------------------

def gradient_shapes(model: str = "resnet50") -> list[tuple[int, ...]]:
    """The shapes of ``model``'s parameters, in the order the model holds them (torchvision
    models with 1000 classes; the guide's small models as the smoke profile builds them)."""
    from ..engine.models import build_model

    shape = {"mnist1d_cnn": (1, 40), "small_resnet": (3, 32, 32)}.get(model, (3, 224, 224))
    classes = 10 if model in ("mnist1d_cnn", "small_resnet") else 1000
    return [tuple(p.shape) for p in build_model(model, num_classes=classes, input_shape=shape).parameters()]


def _fused(comm: _Comm, grads):
    """Flatten every gradient into one buffer, one allreduce, copy the results back."""
    import torch

    flat = comm.allreduce(torch.cat([g.reshape(-1) for g in grads]), "grad.fused")
    return [o.view_as(g) for o, g in zip(torch.split(flat, [g.numel() for g in grads]), grads)]


def measure_gradients(comm: _Comm, shapes: list[tuple[int, ...]], *, model: str = "resnet50", iters: int = 3,
                      methods: tuple[str, ...] = METHODS,
                      ddp_buckets_mb: tuple[float, ...] = ()) -> list[dict[str, Any]]:
    """Allreduce a model's gradient list several ways (see the module doc); one row each.

    ``one-by-one``: each tensor alone, waiting for each; ``async-all``: all submitted, then
    waited for (Horovod fuses them by its threshold; torch.distributed sends each alone);
    ``async-all-fp16``: the same with fp16 compression; ``one-buffer``: flattened into one
    tensor by hand. ``ddp_buckets_mb``: real DDP steps with those bucket caps (torch only).
    """
    import math

    import torch

    grads = [torch.full(s, float(comm.rank + 1), device=comm.device()) for s in shapes]
    total = 4 * sum(math.prod(s) for s in shapes)
    run = {"one-by-one": lambda: comm.allreduce_one_by_one(grads),
           "async-all": lambda: comm.allreduce_list(grads),
           "async-all-fp16": lambda: comm.allreduce_list(grads, fp16=True),
           "one-buffer": lambda: _fused(comm, grads)}
    knobs = {"fusion_threshold_bytes": comm.fusion_bytes, "cycle_time_ms": comm.cycle_ms} \
        if isinstance(comm, _HorovodComm) else {}
    rows = []
    for method in methods:
        rows.append(_row(comm, "gradients", total, _timed(comm, run[method], iters), model=model,
                         tensors=len(grads), method=method, **knobs))
    if ddp_buckets_mb and isinstance(comm, _TorchComm):
        rows += measure_ddp_buckets(comm, shapes, ddp_buckets_mb, model=model, iters=iters)
    return rows


def _stand_in(shapes, device):
    """A module with these parameter shapes whose step is almost free: the loss is the sum of
    every parameter's sum times the input, so backward fills every gradient with one number,
    in reverse order of the parameters, as a network's backward pass makes them ready."""
    import torch
    from torch import nn

    class StandIn(nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = nn.ParameterList(nn.Parameter(torch.zeros(s, device=device)) for s in shapes)

        def forward(self, x):
            total = x.new_zeros(())
            for p in self.weights:
                total = total + p.sum()
            return total * x

    return StandIn()


def measure_ddp_buckets(comm: _Comm, shapes, buckets_mb, *, model: str, iters: int = 3) -> list[dict[str, Any]]:
    """Real DDP steps on the stand-in module, one per bucket cap: the step's time beyond the
    same step without DDP is the communication the step had to wait for."""
    import math

    from torch.nn.parallel import DistributedDataParallel

    module = _stand_in(shapes, comm.device())
    x = module.weights[0].new_ones(1) * (comm.rank + 1)

    def step(m):
        m.zero_grad(set_to_none=True)
        m(x).sum().backward()

    local, local_cpu = _timed(comm, lambda: step(module), iters)
    total = 4 * sum(math.prod(s) for s in shapes)
    rows = []
    for cap in buckets_mb:
        ids = [comm.device().index] if comm.device().type == "cuda" else None
        ddp = DistributedDataParallel(module, device_ids=ids, bucket_cap_mb=cap)
        seconds, cpu = _timed(comm, lambda: step(ddp), iters)
        rows.append(_row(comm, "gradients", total, (max(seconds - local, 1e-9), max(cpu - local_cpu, 0.0)),
                         model=model, tensors=len(shapes), method=f"ddp-bucket-{cap:g}MB", bucket_cap_mb=cap,
                         step_s=seconds, local_step_s=local))
        del ddp
    return rows


# -- which runtimes this machine has, and starting their workers -----------------------------

def unavailable(runtime: str, workers: int = 2, launching: bool = True) -> str | None:
    """Why ``runtime`` cannot run here (one line), or None when it can."""
    r = RUNTIMES[runtime]
    if r.framework == "horovod":
        try:
            import horovod.torch as hvd
        except ImportError as exc:
            return f"Horovod for PyTorch does not import ({exc}); scripts/setup.sh builds it"
        if not (hvd.gloo_built() if r.backend == "gloo" else hvd.mpi_built()):
            return f"this Horovod was built without {r.backend.upper()} (horovodrun --check-build)"
        if launching and r.backend == "mpi" and shutil.which("mpirun") is None:
            return "mpirun not found (apt-get install openmpi-bin)"
        return None
    import torch
    import torch.distributed as tdist

    if r.backend == "gloo":
        return None if tdist.is_gloo_available() else "this PyTorch has no Gloo backend"
    if r.backend == "mpi":
        if not tdist.is_mpi_available():
            return ("this PyTorch was built without MPI (PyPI and conda wheels never have it; it needs a source "
                    "build against the cluster's MPI)")
        return None if not launching or shutil.which("mpirun") else "mpirun not found"
    if not torch.cuda.is_available() or not tdist.is_nccl_available():
        return "NCCL needs NVIDIA GPUs and a CUDA build of PyTorch; none here"
    if launching and torch.cuda.device_count() < workers:
        return f"{workers} workers need {workers} GPUs on this node, it has {torch.cuda.device_count()}"
    return None


def launch_local(runtime: str, workers: int, worker_args: list[str], *, timeout: float = 900) -> list[dict[str, Any]]:
    """Start ``workers`` processes of this command on this machine for ``runtime``; their rows."""
    from ..runtime import launch

    with tempfile.TemporaryDirectory(prefix="guide-comms-") as tmp:
        out = Path(tmp) / "rows.jsonl"
        argv = launch.command(RUNTIMES[runtime].launcher, workers, "guide_utils",
                              ["comms", "--runtime", runtime, *worker_args, "--out", str(out)])
        try:
            proc = subprocess.run(argv, env=launch.environment(), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise GuideError(f"{runtime} with {workers} workers did not finish in {timeout:.0f} s") from None
        if proc.returncode != 0 or not out.exists():
            lines = [ln for ln in (proc.stderr + proc.stdout).strip().splitlines() if "error" in ln.lower()] or \
                (proc.stderr + proc.stdout).strip().splitlines() or ["no output"]
            raise GuideError(f"{runtime} with {workers} workers exited {proc.returncode}: {lines[-1].strip()}")
        return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def meta(**fields: Any) -> dict[str, Any]:
    """When, where and with what a measurement ran: the first row of every result."""
    from .record import provenance

    return {**provenance(**fields), "kind": "meta"}


# -- tables -------------------------------------------------------------------------------------

def table(rows: list[dict[str, Any]]):
    """The measurement rows (not meta or skipped) as a DataFrame."""
    import pandas as pd

    return pd.DataFrame([r for r in rows if r.get("kind") in ("allreduce", "gradients")])


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The sweep and the gradient-list results as two aligned text tables."""
    t = table(rows)
    out = [f"skipped {r['runtime']}: {r['reason']}" for r in rows if r.get("kind") == "skipped"]
    if t.empty:
        return "\n".join(out or ["no measurements"])
    sweep = t[t["kind"] == "allreduce"]
    if not sweep.empty:
        view = sweep.assign(size=sweep["bytes"].map(human_bytes), time_us=sweep["time_s"] * 1e6)
        cols = ["runtime", "compression", "size", "time_us", "algbw_GBps", "busbw_GBps"]
        out.append(view[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    grads = t[t["kind"] == "gradients"]
    if not grads.empty:
        view = grads.assign(time_ms=grads["time_s"] * 1e3, tensors=grads["tensors"].astype(int))
        if "fusion_threshold_bytes" in view:
            view["fusion_MiB"] = view["fusion_threshold_bytes"].map(lambda b: "" if b != b else f"{b / MIB:g}")
            view["cycle_ms"] = view["cycle_time_ms"].map(lambda c: "" if c != c else f"{c:g}")
        cols = [c for c in ("runtime", "model", "tensors", "method", "fusion_MiB", "cycle_ms", "time_ms", "busbw_GBps")
                if c in view]
        out.append(view[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return "\n\n".join(out)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows from a JSON-lines file written by this command (``--out``)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


RECORD_COMMAND = ("python -m guide_utils comms --knobs --fp16 --record "
                  "src/guide_utils/results/recorded/comms_local.jsonl")


def recorded(name: str = "comms_local.jsonl") -> list[dict[str, Any]]:
    """The comms benchmark recorded on the guide's CI machine (:data:`RECORD_COMMAND`); the
    first row is its provenance."""
    from .record import read

    first, rows = read(name)
    return [first, *rows]


# -- the command ------------------------------------------------------------------------------

def build_parser() -> ArgumentParser:
    import argparse

    p = ArgumentParser(prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=__doc__.split("\n\n>>>")[0].split("\n\n", 1)[1],
                       epilog="Examples:\n  python -m guide_utils comms --json                 # every runtime here, "
                              "2 workers each\n  python -m guide_utils comms --runtime horovod-mpi --knobs\n"
                              "  srun --mpi=pmix python -m guide_utils comms --runtime horovod --out comms.jsonl")
    p.add_argument("--runtime", nargs="+", metavar="NAME",
                   help=f"{', '.join(RUNTIMES)} (default: every one this machine has); under a launcher: "
                        "the one to use (horovod takes the launcher's controller)")
    p.add_argument("--workers", type=int, default=2, help="processes to start on this machine (default 2; "
                                                           "under a launcher the launcher decides)")
    p.add_argument("--experiments", nargs="+", choices=["sizes", "gradients"], default=["sizes", "gradients"],
                   help="sizes: the allreduce sweep; gradients: a model's gradient list (default: both)")
    p.add_argument("--min-bytes", default="4", help="smallest message (default 4 B)")
    p.add_argument("--max-bytes", default="256M", help="largest message (default 256M = 256 MiB)")
    p.add_argument("--factor", type=int, default=4, help="between consecutive sizes (default 4)")
    p.add_argument("--budget", default="512M", help="bytes moved per size, which sets the iterations "
                                                     "(3 to 50; default 512M)")
    p.add_argument("--fp16", action="store_true", help="the sweep once more with fp16 compression")
    p.add_argument("--model", default="resnet50", help="whose gradient list (default resnet50)")
    p.add_argument("--iters", type=int, default=3, help="timed repetitions per gradient-list method (default 3)")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS),
                   help="ways to allreduce the gradient list (default: all)")
    p.add_argument("--ddp-buckets", type=float, nargs="*", default=list(DDP_BUCKETS_MB), metavar="MB",
                   help="DDP bucket caps to try, torch runtimes (default 1 5 25 100; 25 is DDP's default)")
    p.add_argument("--knobs", action="store_true", help="also Horovod's fusion threshold x cycle time grid "
                                                        "(one launch each; local runs only)")
    p.add_argument("--fusion-threshold", help="Horovod: HOROVOD_FUSION_THRESHOLD for this run (e.g. 32M; 0: off)")
    p.add_argument("--cycle-time", type=float, help="Horovod: HOROVOD_CYCLE_TIME in ms for this run")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of tables")
    p.add_argument("--show", metavar="FILE", help="print the tables of a results file (--out) and exit")
    p.add_argument("--out", help="append the JSON lines to this file")
    p.add_argument("--record", help="write the results to this file, replacing it, with their provenance first "
                                    "(load before and after, commit, versions)")
    return p


def _check(args) -> None:
    if args.workers < 1:
        raise GuideError(f"--workers must be 1 or more, got {args.workers}")
    if args.iters < 1:
        raise GuideError(f"--iters must be 1 or more, got {args.iters}")
    if any(b <= 0 for b in args.ddp_buckets):
        raise GuideError(f"--ddp-buckets must be positive MB, got {args.ddp_buckets}")
    if args.cycle_time is not None and not 0 < args.cycle_time <= 1000:
        raise GuideError(f"--cycle-time is in milliseconds, 0 to 1000, got {args.cycle_time}")
    for name in args.runtime or ():
        if name not in RUNTIMES and name != "horovod":
            raise GuideError(f"unknown --runtime {name!r}; choose from {', '.join(RUNTIMES)}")


def _worker_args(args, sizes_list) -> list[str]:
    out = ["--experiments", *args.experiments, "--min-bytes", str(sizes_list[0]) if sizes_list else "4",
           "--max-bytes", str(sizes_list[-1]) if sizes_list else "4", "--factor", str(args.factor),
           "--budget", args.budget, "--model", args.model, "--iters", str(args.iters),
           "--ddp-buckets", *map(str, args.ddp_buckets), "--methods", *args.methods]
    out += ["--fp16"] if args.fp16 else []
    out += ["--fusion-threshold", args.fusion_threshold] if args.fusion_threshold is not None else []
    return out + (["--cycle-time", str(args.cycle_time)] if args.cycle_time is not None else [])


def _fusion_bytes(text: str) -> int:
    return 0 if str(text).strip() in ("0", "0M", "0B") else parse_bytes(text, "--fusion-threshold")


def run_worker(args, message_sizes: list[int]) -> list[dict[str, Any]]:
    """This process is one worker of a launched job: measure, and return rank 0's rows."""
    from ..runtime.launch import started_by

    launcher = started_by()
    runtime = (args.runtime or [None])[0] or ("horovod" if launcher in ("horovodrun", "mpirun") else
                                              "torch-nccl" if not unavailable("torch-nccl", 1, False) else "torch-gloo")
    horovod = runtime.startswith("horovod")
    if not horovod and (args.fusion_threshold is not None or args.cycle_time is not None):
        raise GuideError("--fusion-threshold and --cycle-time are Horovod's; with torch runtimes try --ddp-buckets")
    if args.fusion_threshold is not None:  # read by hvd.init()
        os.environ["HOROVOD_FUSION_THRESHOLD"] = str(_fusion_bytes(args.fusion_threshold))
    if args.cycle_time is not None:
        os.environ["HOROVOD_CYCLE_TIME"] = str(args.cycle_time)
    comm = connect(runtime)
    try:
        rows = [meta(runtime=comm.label, workers=comm.size, launcher=launcher)]
        if "sizes" in args.experiments:
            rows += measure_sizes(comm, message_sizes, budget_bytes=parse_bytes(args.budget, "--budget"))
            if args.fp16:
                rows += measure_sizes(comm, message_sizes, budget_bytes=parse_bytes(args.budget, "--budget"),
                                      fp16=True)
        if "gradients" in args.experiments:
            rows += measure_gradients(comm, gradient_shapes(args.model), model=args.model, iters=args.iters,
                                      methods=tuple(args.methods), ddp_buckets_mb=tuple(args.ddp_buckets))
    finally:
        comm.shutdown()
    return rows if comm.rank == 0 else []


def run_local(args, message_sizes: list[int]) -> list[dict[str, Any]]:
    """No launcher: start ``--workers`` processes per runtime on this machine."""
    names = args.runtime or list(RUNTIMES)
    if "horovod" in names:
        raise GuideError("--runtime horovod is for runs under a launcher; here name horovod-gloo or horovod-mpi")
    reasons = {name: unavailable(name, args.workers) for name in names}
    for name, reason in reasons.items():
        if reason and args.runtime:  # asked for by name: say so and stop, before anything runs
            raise GuideError(f"--runtime {name}: {reason}")
    rows: list[dict[str, Any]] = [meta(workers=args.workers, launcher="local")]
    for name in names:
        if reasons[name]:
            rows.append({"kind": "skipped", "runtime": name, "reason": reasons[name]})
            continue
        rows += [r for r in launch_local(name, args.workers, _worker_args(args, message_sizes)) if r["kind"] != "meta"]
        if args.knobs and name.startswith("horovod"):
            for threshold, cycle in HOROVOD_GRID:
                knob = argparse_copy(args, experiments=["gradients"], fusion_threshold=f"{threshold}M",
                                     cycle_time=cycle, fp16=False, methods=["async-all"])
                rows += [r for r in launch_local(name, args.workers, _worker_args(knob, message_sizes))
                         if r["kind"] == "gradients" and r["method"] == "async-all"]
    return rows


def argparse_copy(args, **changes):
    import argparse

    return argparse.Namespace(**{**vars(args), **changes})


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    from ..runtime.launch import started_by

    args = build_parser().parse_args(argv)
    if args.show:
        print(format_rows(read_rows(args.show)))
        return 0
    _check(args)
    message_sizes = sizes(parse_bytes(args.min_bytes, "--min-bytes"), parse_bytes(args.max_bytes, "--max-bytes"),
                          args.factor)
    if args.fusion_threshold is not None:
        _fusion_bytes(args.fusion_threshold)  # a bad value fails here, before anything starts
    rows = run_worker(args, message_sizes) if started_by() else run_local(args, message_sizes)
    if not rows:  # not rank 0
        return 0
    if args.record:
        from .record import write

        import shlex

        given = sys.argv[1:] if argv is None else argv
        first = {**rows[0], "kind": "provenance", "load_avg_1min_after": round(os.getloadavg()[0], 2),
                 "regenerate": " ".join([PROG, *map(shlex.quote, given)])}
        write(args.record, first, rows[1:])
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    if args.json:
        for r in rows:
            print(json.dumps(r), flush=True)
    elif not (args.out and started_by()):
        print(format_rows(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def plan_lines(profile: str) -> list[str]:
    """What chapter 10 runs at ``profile`` scale, as the commands that run it."""
    if profile == "full":
        return ["the allreduce from 4 B to 256 MiB and ResNet-50's gradient list, one task per GPU, on your nodes:",
                *(f"  slurm_examples/submit.sh slurm_examples/10_communication.sbatch --nodes={n}" for n in (1, 2, 8)),
                "  RUNTIME=torch slurm_examples/submit.sh slurm_examples/10_communication.sbatch --nodes=2",
                "then compare each job's large-message busbw (comms --show FILE) with the network's bandwidth"]
    return ["on this machine, 2 workers per runtime, 4 B to 256 MiB:",
            "  python -m guide_utils comms --json",
            "recorded with:", "  " + RECORD_COMMAND.replace(" --record ", " \\\n      --record ")]
