"""A real model's gradient list allreduced the ways a training step can: one tensor at a
time, all at once (Horovod's tensor fusion, with or without fp16 compression), one buffer
flattened by hand, and DDP's buckets (real ``DistributedDataParallel`` on a stand-in module
with the model's parameter shapes and almost no arithmetic).
"""

from __future__ import annotations

from typing import Any

from .measure import result_row, timed
from .runtimes import Comm, HorovodComm, TorchComm

DDP_BUCKETS_MB = (1, 5, 25, 100)  # 25: DDP's default bucket_cap_mb
METHODS = ("one-by-one", "async-all", "async-all-fp16", "one-buffer")


def gradient_shapes(model: str = "resnet50") -> list[tuple[int, ...]]:
    """The shapes of ``model``'s parameters, in the order the model holds them (torchvision
    models with 1000 classes; the guide's small models as the smoke profile builds them)."""
    from ...engine.models import build_model

    shape = {"mnist1d_cnn": (1, 40), "small_resnet": (3, 32, 32)}.get(model, (3, 224, 224))
    classes = 10 if model in ("mnist1d_cnn", "small_resnet") else 1000
    return [tuple(p.shape) for p in build_model(model, num_classes=classes, input_shape=shape).parameters()]


def _fused(comm: Comm, grads):
    """Flatten every gradient into one buffer, one allreduce, copy the results back."""
    import torch

    flat = comm.allreduce(torch.cat([g.reshape(-1) for g in grads]), "grad.fused")
    return [o.view_as(g) for o, g in zip(torch.split(flat, [g.numel() for g in grads]), grads)]


def measure_gradients(comm: Comm, shapes: list[tuple[int, ...]], *, model: str = "resnet50", iters: int = 3,
                      methods: tuple[str, ...] = METHODS,
                      ddp_buckets_mb: tuple[float, ...] = ()) -> list[dict[str, Any]]:
    """Allreduce a model's gradient list several ways (see below); one row each.

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
        if isinstance(comm, HorovodComm) else {}
    rows = []
    for method in methods:
        rows.append(result_row(comm, "gradients", total, timed(comm, run[method], iters), model=model,
                               tensors=len(grads), method=method, **knobs))
    if ddp_buckets_mb and isinstance(comm, TorchComm):
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


def measure_ddp_buckets(comm: Comm, shapes, buckets_mb, *, model: str, iters: int = 3) -> list[dict[str, Any]]:
    """Real DDP steps on the stand-in module, one per bucket cap: the step's time beyond the
    same step without DDP is the communication the step had to wait for."""
    import math

    from torch.nn.parallel import DistributedDataParallel

    module = _stand_in(shapes, comm.device())
    x = module.weights[0].new_ones(1) * (comm.rank + 1)

    def step(m):
        m.zero_grad(set_to_none=True)
        m(x).sum().backward()

    local, local_cpu = timed(comm, lambda: step(module), iters)
    total = 4 * sum(math.prod(s) for s in shapes)
    rows = []
    for cap in buckets_mb:
        ids = [comm.device().index] if comm.device().type == "cuda" else None
        ddp = DistributedDataParallel(module, device_ids=ids, bucket_cap_mb=cap)
        seconds, cpu = timed(comm, lambda: step(ddp), iters)
        waited = (max(seconds - local, 1e-9), max(cpu - local_cpu, 0.0))
        rows.append(result_row(comm, "gradients", total, waited, model=model, tensors=len(shapes),
                               method=f"ddp-bucket-{cap:g}MB", bucket_cap_mb=cap, step_s=seconds, local_step_s=local))
        del ddp
    return rows
