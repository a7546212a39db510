"""One interface over the three ways this guide runs PyTorch: alone, Horovod, or DDP.

Training code asks a :class:`Dist` for its rank and world size, hands it the model and the
optimizer to prepare, and averages metrics through it; it never branches on the backend.
Who launched the processes (horovodrun, mpirun, srun, torchrun, ...) is read from the
environment (``runtime.launchers``), so the same command line works under each launcher.

>>> dist = init("none")
>>> (dist.rank, dist.size, dist.is_root)
(0, 1, True)
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import GuideError
from ..runtime.gpus import GPU_DRIVERS, VISIBLE, allocated, device_index
from ..runtime import launchers
from . import hvd_wait

KINDS = ("none", "horovod", "ddp")
GPU_BACKEND = "nccl"  # RCCL on ROCm builds of PyTorch, under the same name


def process_group_backend(device_type: str, gpu_backend: str = GPU_BACKEND) -> str:
    """The torch.distributed backend for ranks on ``device_type`` devices.

    NCCL reduces only GPU tensors, but the engine also reduces small CPU tensors (the stop
    flag, the epoch's sums) and pickled objects: on GPUs each device type gets the backend
    that can reduce it, else the first CPU collective fails ("No backend type associated
    with device type cpu").

    >>> process_group_backend("cuda")
    'cpu:gloo,cuda:nccl'
    >>> process_group_backend("cpu")
    'gloo'
    """
    return f"cpu:gloo,cuda:{gpu_backend}" if device_type == "cuda" else "gloo"


@dataclass
class Dist:
    """The distributed context of this process."""

    kind: str
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    device: Any = None
    _hvd: Any = field(default=None, repr=False)
    # The CPUs this rank can count on (Launcher.cpu_share), read from the launcher that started
    # it: after the engine has exported torch's variables (RANK, LOCAL_WORLD_SIZE) an srun task
    # reads as torchrun's. None: every CPU the process may run on.
    cpus: int | None = None

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def prepare(self, model, optimizer, *, fp16_allreduce: bool = False, bucket_mb: float | None = None,
                accumulate_steps: int = 1):
        """Make every rank start from rank 0's weights and average gradients.

        Returns ``(model, optimizer)``; the model may be wrapped (DDP) and the optimizer is
        replaced (Horovod). Horovod's wrapper starts with an empty optimizer state, so
        restore a checkpoint's optimizer state *after* this call, on every rank.
        ``fp16_allreduce`` sends gradients as fp16 (Horovod's compression, DDP's
        fp16_compress_hook); ``bucket_mb`` is DDP's bucket cap (None: PyTorch's 25 MB).

        ``accumulate_steps`` backward passes add up before each optimizer step. Horovod's
        optimizer counts them itself (its ``backward_passes_per_step``: each gradient is
        allreduced once, after its last pass); DDP reduces on every backward unless the
        caller runs the others under :meth:`no_sync`.
        """
        if self.kind == "horovod":
            hvd = self._hvd
            compression = hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none
            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                                 compression=compression,
                                                 backward_passes_per_step=accumulate_steps)
            # Without this broadcast each rank would start from its own random init and the
            # ranks would drift apart. (hvd.broadcast_optimizer_state is not called: on a fresh
            # optimizer it initialises the state with a zero-gradient step, which weight decay
            # turns into a real update, p -= lr*wd*p; resumed state is loaded on every rank.)
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        elif self.kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device is not None and self.device.type == "cuda" else None
            # broadcasts rank 0's weights
            model = DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket_mb)
            if fp16_allreduce:
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

                model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return model, optimizer

    @staticmethod
    def no_sync(model, final: bool):
        """Where a backward pass that is not the last of an optimizer step runs: DDP's
        ``no_sync()`` (gradients stay local, added to by the next pass; the last pass reduces
        their sum), else nothing (Horovod's optimizer delays its allreduce itself; alone
        there is nothing to reduce)."""
        import contextlib

        if final or not hasattr(model, "no_sync"):
            return contextlib.nullcontext()
        return model.no_sync()

    def allreduce_mean(self, tensor, name: str = "metric"):
        """The mean of ``tensor`` over all ranks (a new tensor; the input is not modified)."""
        if self.kind == "horovod":
            return self._hvd.allreduce(tensor, average=True, name=name)
        if self.kind == "ddp":
            import torch.distributed as tdist

            out = tensor.clone()
            tdist.all_reduce(out, op=tdist.ReduceOp.SUM)
            return out / self.size
        return tensor.clone()

    def allgather_object(self, obj):
        """Every rank's ``obj``, in rank order, on every rank."""
        if self.kind == "horovod":
            return self._hvd.allgather_object(obj)
        if self.kind == "ddp":
            import torch.distributed as tdist

            out = [None] * self.size
            tdist.all_gather_object(out, obj)
            return out
        return [obj]

    def barrier(self) -> None:
        if self.kind == "horovod":
            self._hvd.barrier()
        elif self.kind == "ddp":
            import torch.distributed as tdist

            tdist.barrier()

    def shutdown(self) -> None:
        if self.kind == "horovod":
            self._hvd.shutdown()
        elif self.kind == "ddp":
            import gc

            import torch.distributed as tdist

            # DDP's wrapper keeps the process group (through its reducer) in reference cycles
            # that only the garbage collector frees, so without this the group outlives
            # destroy_process_group into the interpreter's finalization, where PyTorch has
            # reports of Gloo teardowns aborting the process (rank 0 once aborted so after a
            # finished run here: docs/history.md, ci35).
            gc.collect()
            if tdist.is_initialized():
                tdist.destroy_process_group()


def _pick_device(local_rank: int):
    """This rank's device: its own GPU when there are GPUs, else the CPU (refused where the job
    gave this process GPUs that this PyTorch does not see: ``refuse_cpu_on_gpus``).

    >>> _pick_device(0).type in ("cpu", "cuda")
    True
    """
    import torch

    if torch.cuda.is_available():
        # One process per GPU: without set_device every rank on a node would allocate on GPU 0.
        # The rule is runtime.gpus's, which `python -m guide_utils doctor --tasks` checks too.
        index = device_index(local_rank, torch.cuda.device_count())
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    refuse_cpu_on_gpus(os.environ, torch.__version__, torch.version)
    return torch.device("cpu")


def refuse_cpu_on_gpus(env, torch_version: str, version) -> None:
    """Refuse, in one line, to train on the CPU when the job gave this process GPUs (``env``
    names them: ``runtime.gpus.allocated``) that this PyTorch does not see (a CPU-only wheel, the
    other vendor's build; ``version`` is ``torch.version``): what the doctor stops, here also where
    the job's doctor ran --quick (GUIDE_DOCTOR=quick). Only the tests' Slurm's GPUs, device files
    with nothing behind them, are trained past on the CPU: that Slurm (tests/slurm_cluster.py)
    gives its jobs GUIDE_FAKE_GPUS=1, honoured (and said) only where no GPU driver is loaded."""
    given = allocated(env)
    if not given:
        return
    if env.get("GUIDE_FAKE_GPUS") == "1" and not any(Path(d).exists() for d in GPU_DRIVERS):
        print(f"[train] GUIDE_FAKE_GPUS=1 and no GPU driver here: {given} are taken for device files "
              "without GPUs; training on the CPU", file=sys.stderr, flush=True)
        return
    build = (f"ROCm {version.hip}" if getattr(version, "hip", None) else
             f"CUDA {version.cuda}" if getattr(version, "cuda", None) else "CPU-only")
    wanted = "a ROCm build of PyTorch" if given.split("=")[0] in VISIBLE[1:] else "a PyTorch built for these GPUs"
    raise GuideError(f"the job has GPUs ({given}) but this PyTorch {torch_version} ({build} build) sees none; "
                     f"refusing to train on the CPU: install {wanted} or load the site's PyTorch module (the Slurm "
                     "chapter's 'Which PyTorch for which GPU'), or run a job without GPUs")


def _init_horovod(fusion_threshold_mb: float | None = None, cycle_time_ms: float | None = None) -> Dist:
    launcher = launchers.require("horovod")  # read before hvd.init(), which may set MPI's own variables
    # Tensor fusion settings are read from the environment by hvd.init() (horovodrun's
    # --fusion-threshold-mb and --cycle-time-ms set the same variables).
    if fusion_threshold_mb is not None:
        os.environ["HOROVOD_FUSION_THRESHOLD"] = str(int(fusion_threshold_mb * 2**20))
    if cycle_time_ms is not None:
        os.environ["HOROVOD_CYCLE_TIME"] = f"{cycle_time_ms:g}"
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        raise GuideError(f"Horovod for PyTorch does not import ({exc}); run scripts/setup.sh, "
                         "or use --dist ddp, which needs no Horovod") from None
    if not hasattr(hvd, "init"):  # imported with a warning: the compiled extension was never built
        raise GuideError("Horovod was built without its PyTorch extension (installed before PyTorch, or without "
                         "HOROVOD_WITH_PYTORCH=1); rebuild it with scripts/setup.sh, or use --dist ddp")
    hvd.init()
    try:
        # The world the launcher made is the one Horovod must see: where srun's PMI plugin
        # and the MPI Horovod was built with do not meet, each task is alone.
        launcher.check_world(hvd.size(), "Horovod")
    except GuideError:
        hvd.shutdown()
        raise
    local_rank = hvd.local_rank()
    device = _pick_device(local_rank)
    if device.type == "cpu":  # ranks may share cores: a waiting rank must not spin (hvd_wait)
        hvd_wait.sleep_while_waiting()
    return Dist("horovod", hvd.rank(), hvd.size(), local_rank, hvd.local_size(), device, hvd, cpus=launcher.cpu_share())


def _init_ddp() -> Dist:
    import torch.distributed as tdist

    launcher = launchers.require("ddp")
    # What torch's env:// init reads and the launcher did not set (srun without torchrun:
    # ranks from the step, the rendezvous port checked by rank 0 and agreed on).
    launcher.export_torch_env()
    local_rank = launcher.local_rank
    device = _pick_device(local_rank)
    tdist.init_process_group(backend=process_group_backend(device.type),
                             device_id=device if device.type == "cuda" else None)
    launcher.rendezvous_done()  # every rank has joined
    return Dist("ddp", tdist.get_rank(), tdist.get_world_size(), local_rank, launcher.local_size, device,
                cpus=launcher.cpu_share())


def init(kind: str = "none", *, fusion_threshold_mb: float | None = None, cycle_time_ms: float | None = None) -> Dist:
    """Start the distributed runtime named ``kind`` (one of ``KINDS``) for this process;
    Horovod with these tensor-fusion settings (None: Horovod's defaults, 128 MiB and 1 ms)."""
    if kind == "horovod":
        return _init_horovod(fusion_threshold_mb, cycle_time_ms)
    if kind == "ddp":
        return _init_ddp()
    if kind == "none":
        return Dist("none", device=_pick_device(0))
    raise ValueError(f"dist must be one of {', '.join(KINDS)}, got {kind!r}")
