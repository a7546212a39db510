"""Everything a PyTorch run carries from step to step, and how it survives a restart.

:func:`build` makes the optimizer, the learning-rate scheduler and (for fp16) the gradient
scaler, restores them from the newest checkpoint when there is one, and lets the
distribution backend wrap model and optimizer; :func:`save` writes the state back. The
order matters for an exact resume: weights before the broadcast, the optimizer's state
after Horovod has wrapped it, the random generators last.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..core.config import TrainConfig
from ..core.errors import GuideError
from . import checkpoint
from .plan import RunPlan, keep_global_batch


@dataclass
class TrainingState:
    model: Any  # what the loop calls: wrapped by DDP, compiled with --compile
    module: Any  # the plain model (checkpoints, digests, evaluation)
    wrapped: Any  # what the backend returned (DDP's wrapper has no_sync), before --compile
    optimizer: Any
    scheduler: Any
    scaler: Any
    memory_format: Any
    autocast: Callable[[], Any]
    meta: dict[str, Any]
    start_epoch: int = 0
    start_position: int = 0
    partial: list[float] | None = None  # metric sums of the epoch a stop interrupted
    run_name: str | None = None
    loaded: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def resuming(self) -> str:
        """How the banner says where the run picks up (empty for a fresh start)."""
        if self.loaded is None:
            return ""
        return f", resuming {self.loaded.name} at epoch {self.start_epoch} sample {self.start_position}"


def build(cfg: TrainConfig, plan: RunPlan, model, dist, *, data_name: str, num_classes: int) -> TrainingState:
    """Optimizer, scheduler and scaler for ``model``; resumed from the newest checkpoint in
    ``cfg.checkpoint_dir`` if there is one; model and optimizer prepared by ``dist``."""
    import torch

    from ..core.schedules import torch_scheduler

    optimizer = make_optimizer(cfg, model.parameters(), lr=plan.peak_lr)
    scaler = torch.amp.GradScaler("cuda") if cfg.amp == "fp16" else None
    # What must match to resume (model, data, optimizer) and what the schedule depends on:
    # the global batch, not how it is split. Workers, per-worker batch and accumulation steps
    # are recorded, and may change (4 workers x b resume as 2 x b x 2: the same global batch).
    same = {"model": cfg.model, "data": data_name, "num_classes": num_classes, "optimizer": cfg.optimizer}
    meta = {**same, "per_worker_batch": cfg.per_worker_batch, "workers": plan.workers,
            "accumulate_steps": plan.accumulate_steps, "global_batch": plan.global_batch}
    loaded = checkpoint.load_latest(Path(cfg.checkpoint_dir), expect=same, map_location="cpu") \
        if cfg.checkpoint_dir else None
    resume = {}
    if loaded is not None:
        st = loaded.state
        model.load_state_dict(st["model"])  # on every rank: all read the same file
        resume = {"start_epoch": int(st["epoch"]), "start_position": _start_position(loaded, plan),
                  "run_name": st.get("run_name") or cfg.run_name, "partial": st.get("partial"),
                  "loaded": loaded.path}
        if scaler is not None and "scaler" in st:
            scaler.load_state_dict(st["scaler"])
    _ranks_agree_on_the_checkpoint(cfg, dist, resume)
    module = model
    model, optimizer = dist.prepare(model, optimizer, fp16_allreduce=cfg.fp16_allreduce, bucket_mb=cfg.ddp_bucket_mb,
                                    accumulate_steps=plan.accumulate_steps)
    wrapped = model
    scheduler = torch_scheduler(optimizer, steps_per_epoch=plan.steps_per_epoch, **plan.schedule)
    if loaded is not None:
        scheduler.load_state_dict(loaded.state["scheduler"])
        # Last: it restores momentum buffers and the learning rate of the next step.
        optimizer.load_state_dict(loaded.state["optimizer"])
        checkpoint.set_rng_state(loaded.state["rng"])
    memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
    compiled = torch.compile(model, mode=cfg.compile_mode) if cfg.compile or cfg.compile_mode else model
    return TrainingState(model=compiled, module=module, wrapped=wrapped,
                         optimizer=optimizer, scheduler=scheduler, scaler=scaler, memory_format=memory_format,
                         autocast=_autocast(cfg, dist.device), meta=meta,
                         **{"run_name": cfg.run_name, **resume})


def _start_position(loaded: checkpoint.LoadedCheckpoint, plan: RunPlan) -> int:
    """Where this rank resumes in its shard of the checkpoint's epoch, in samples.

    The checkpoint must have been written for this run's global batch (else GuideError: the
    learning rate and the schedule would not continue). Its position counts the samples of
    its writer's shard; what carries over between worker counts is the optimizer step it
    stopped at. Every global step is the same set of samples whatever the split, because the
    sampler deals the epoch's permutation out to the ranks in turn: step s of W workers x b
    x N covers positions s*G to (s+1)*G - 1 of the permutation, G = W*b*N.
    """
    meta = loaded.state.get("meta", {})
    workers, batch = int(meta.get("workers", 1)), int(meta.get("per_worker_batch", plan.per_worker_batch))
    accumulate = int(meta.get("accumulate_steps", 1))
    written = int(meta.get("global_batch", workers * batch * accumulate))
    if written != plan.global_batch:
        raise GuideError(f"checkpoint {loaded.path} was written by {workers} worker(s) x {batch}"
                         + (f" x {accumulate} accumulation steps" if accumulate > 1 else "")
                         + f" = global batch {written}, this run has {plan.workers} x {plan.per_worker_batch}"
                         + (f" x {plan.accumulate_steps}" if plan.accumulate_steps > 1 else "")
                         + f" = {plan.global_batch}, so the learning rate and schedule would not continue; "
                         + keep_global_batch(written, plan.workers, plan.per_worker_batch)
                         + ", or use a fresh --checkpoint-dir")
    return int(loaded.state["position"]) // (batch * accumulate) * plan.samples_per_step


def make_optimizer(cfg: TrainConfig, params, *, lr: float):
    """The optimizer ``cfg.optimizer`` names, at learning rate ``lr`` (the schedule then drives it).

    * ``sgd``: the thesis's SGD with momentum and weight decay;
    * ``lars``: SGD whose step for each layer is scaled by ``trust_coeff * |w| / |grad|`` (You,
      Gitman and Ginsburg 2017), so no layer's update outgrows its weights at large rates;
    * ``lamb``: the same layer-wise trust ratio on top of Adam (You et al. 2019).

    LARS and LAMB are timm's implementations: the reference others adapt, kept up to date
    with PyTorch, and plain ``torch.optim.Optimizer`` subclasses, which Horovod's
    ``DistributedOptimizer`` and DDP wrap like SGD.
    """
    import torch

    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    from timm.optim import Lamb, Lars

    if cfg.optimizer == "lars":
        return Lars(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return Lamb(params, lr=lr, weight_decay=cfg.weight_decay)


def _autocast(cfg: TrainConfig, device) -> Callable[[], Any]:
    if cfg.amp == "none":
        return contextlib.nullcontext
    import torch

    dtype = torch.bfloat16 if cfg.amp == "bf16" else torch.float16
    return lambda: torch.autocast(device.type, dtype=dtype)


def _ranks_agree_on_the_checkpoint(cfg: TrainConfig, dist, resume: dict) -> None:
    # Every rank reads the checkpoint itself (Horovod's optimizer-state broadcast would first
    # take a weight-decay step on the ranks without state), so all must see the same one.
    positions = dist.allgather_object((resume.get("start_epoch", 0), resume.get("start_position", 0)))
    if len(set(positions)) > 1:
        raise GuideError(f"ranks found different checkpoints in {cfg.checkpoint_dir} ({sorted(set(positions))}); "
                         "--checkpoint-dir must be on a filesystem every node shares")


def save(cfg: TrainConfig, dist, state: TrainingState, run_name: str | None, *, epoch: int, position: int,
         partial: list[float] | None) -> None:
    """Rank 0 writes the checkpoint for (epoch, position); the others have nothing to do."""
    if not dist.is_root:
        return
    snapshot = {"meta": state.meta, "model": state.module.state_dict(), "optimizer": state.optimizer.state_dict(),
                "scheduler": state.scheduler.state_dict(), "epoch": epoch, "position": position,
                "rng": checkpoint.rng_state(), "run_name": run_name}
    if partial is not None:
        snapshot["partial"] = partial
    if state.scaler is not None:
        snapshot["scaler"] = state.scaler.state_dict()
    step = position // (cfg.per_worker_batch * cfg.accumulate_steps) if position else None
    checkpoint.save(Path(cfg.checkpoint_dir), snapshot, epoch=epoch, step=step, keep=cfg.keep_checkpoints)
