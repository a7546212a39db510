"""DDP on GPUs: the engine's CPU collectives (stop flag, epoch sums, gathered objects) must
not go to NCCL, which reduces only GPU tensors. This machine has no GPU, so a backend
registered for CUDA devices only stands in for NCCL: the crash a GPU run met is reproduced,
and the engine's choice of backend is shown to avoid it."""

from __future__ import annotations

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as tdist  # noqa: E402

from guide_utils.engine import distributed  # noqa: E402
from guide_utils.engine.metrics import Sums  # noqa: E402

CUDA_ONLY = "cudaonlyfake"  # reduces like Gloo, but torch routes only CUDA tensors to it


def _register_cuda_only_backend() -> None:
    if not hasattr(tdist.Backend, CUDA_ONLY.upper()):
        tdist.Backend.register_backend(
            CUDA_ONLY, lambda store, rank, size, timeout: tdist.ProcessGroupGloo(store, rank, size, timeout),
            devices=["cuda"])


def _engine_collectives(dist) -> list:
    """What the engine reduces on the CPU in every run: the epoch's sums, the stop flag
    (engine/loop.py) and an object gathered from every rank."""
    sums = Sums("cpu")
    sums.restore([2.0, 1.0, 1.0, 4.0])  # an interrupted epoch's four sums, as a resume carries them
    stop = dist.allreduce_mean(torch.tensor([0.0]), name="stop")
    return [sums.totals(dist), stop.item(), dist.allgather_object("rank 0")]


@pytest.fixture
def one_rank_group():
    """``start(backend)``: a one-rank process group over an in-memory store; destroyed after."""
    _register_cuda_only_backend()

    def start(backend: str):
        tdist.init_process_group(backend, store=tdist.HashStore(), rank=0, world_size=1)
        return distributed.Dist("ddp", 0, 1)

    yield start
    if tdist.is_initialized():
        tdist.destroy_process_group()


def test_a_gpu_only_backend_cannot_reduce_the_engine_s_cpu_tensors(one_rank_group):
    """What `--dist ddp` on GPUs did before: backend="nccl" alone, and the first CPU
    collective failed."""
    dist = one_rank_group(f"cuda:{CUDA_ONLY}")
    with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
        _engine_collectives(dist)


def test_the_engine_s_backend_for_gpus_reduces_cpu_tensors_too(one_rank_group):
    dist = one_rank_group(distributed.process_group_backend("cuda", gpu_backend=CUDA_ONLY))
    assert _engine_collectives(dist) == [[2.0, 1.0, 1.0, 4.0], 0.0, ["rank 0"]]


def test_ddp_on_a_gpu_asks_for_a_backend_per_device_type(monkeypatch):
    """The engine's own start-up under torchrun on a GPU node: which backend it asks for."""
    asked = {}
    # torchrun's variables for rank 0 of 4 (the launcher is read from them: runtime.launchers)
    for name, value in {"TORCHELASTIC_RUN_ID": "t", "RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    monkeypatch.setattr(distributed, "_pick_device", lambda local_rank: torch.device("cuda", local_rank))
    monkeypatch.setattr(tdist, "init_process_group", lambda **kw: asked.update(kw))
    monkeypatch.setattr(tdist, "get_rank", lambda: 0)
    monkeypatch.setattr(tdist, "get_world_size", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "0")
    dist = distributed.init("ddp")
    assert asked["backend"] == "cpu:gloo,cuda:nccl" and asked["device_id"] == torch.device("cuda", 0)
    assert (dist.kind, dist.size, dist.device.type) == ("ddp", 4, "cuda")


def test_shutdown_frees_the_ddp_wrapper_before_the_group_goes(one_rank_group):
    """The wrapper's reducer holds the process group, and the wrapper can sit in reference
    cycles (in a fresh process it outlived the function that made it until the garbage
    collector ran; in a test worker that had run other tests it did not): the engine's
    shutdown collects such a wrapper while the interpreter is whole, before
    destroy_process_group. The cycle is made here, so that only a collection frees it."""
    dist = one_rank_group("gloo")

    def one_step():
        model, _ = dist.prepare(torch.nn.Linear(4, 2), None)
        model(torch.randn(3, 4)).sum().backward()
        model.cycle = [model]  # a reference cycle, as the reducer's hooks made one
        return weakref.ref(model)

    was_enabled = gc.isenabled()
    gc.disable()  # only the shutdown may collect
    try:
        wrapper = one_step()
        assert wrapper() is not None, "the wrapper went without the collector: this test shows nothing"
        dist.shutdown()
        assert wrapper() is None and not tdist.is_initialized()
    finally:
        if was_enabled:
            gc.enable()
