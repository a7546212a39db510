"""The runtimes the comms benchmark measures, and joining one from inside a launched job.

Each runtime (Horovod over Gloo or MPI, ``torch.distributed`` over Gloo, MPI or NCCL) is
wrapped in one object with the same few operations, so that the measurements
(``measure``, ``gradients``) are written once; :func:`unavailable` says in one
line why a runtime cannot run on this machine.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from ...core.errors import GuideError

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
# Horovod 0.28.1's tensor-fusion defaults, (threshold MiB, cycle time ms): 128 MiB and 1 ms
# (horovod/common/operations.cc); what a run reports when the variables are unset.
HOROVOD_DEFAULTS = (128, 1.0)


# -- the workers' side: one object per runtime with the same few operations -----------------

class Comm:
    """What the measurements need of a runtime: rank, size, allreduce (one tensor, many, or
    with fp16 compression), barrier and the max of a number over ranks."""

    rank = 0
    size = 1
    label = ""

    def device(self):
        import torch

        return torch.device("cpu")


class HorovodComm(Comm):
    def __init__(self, requested: str):
        from ...engine import distributed

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


class TorchComm(Comm):
    def __init__(self, backend: str):
        import torch
        import torch.distributed as tdist

        from ...runtime import launchers

        launcher = launchers.require("ddp")
        launcher.export_torch_env()  # what the launcher did not set (srun: ranks and rendezvous from the step)
        self._device = torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(launcher.local_rank)
            self._device = torch.device("cuda", launcher.local_rank)
        tdist.init_process_group(backend=backend)
        launcher.rendezvous_done()
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


def connect(runtime: str) -> Comm:
    """Join the job this launcher started, with ``runtime`` (``horovod`` takes whichever
    controller the launcher gave)."""
    if runtime.startswith("horovod"):
        return HorovodComm(runtime)
    if runtime in ("torch-gloo", "torch-mpi", "torch-nccl"):
        reason = unavailable(runtime, workers=1, launching=False)
        if reason:
            raise GuideError(f"--runtime {runtime}: {reason}")
        return TorchComm(runtime.split("-", 1)[1])
    raise GuideError(f"unknown --runtime {runtime!r}; choose from horovod, {', '.join(RUNTIMES)}")


# -- which runtimes this machine has ----------------------------------------------------------

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
