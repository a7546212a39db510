"""The training engine: the one loop every notebook, sbatch script, benchmark and test runs.

    from guide_utils.core.config import make_config
    from guide_utils.engine import train
    result = train(make_config("smoke", epochs=2))

The loop is the PyTorch-examples ImageNet recipe the thesis used (SGD momentum 0.9, weight
decay 1e-4, step drops at 30/60/80) plus what distributed runs need and people often get
wrong: a sampler that shards and reshuffles per epoch, rank 0's weights broadcast to all,
metrics averaged over all ranks, output from rank 0 only, the learning rate scaled to the
global batch and updated every iteration, checkpoints that survive preemption, and a run
record per run. The run plan and the bookkeeping are shared with the TensorFlow door
(``plan``, ``bookkeeping``); what is PyTorch's own lives here and in ``state``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.config import TrainConfig
from ..core.errors import GuideError
from . import checkpoint, distributed, state as run_state
from .bookkeeping import RunBook, environment, weights_digest
from .metrics import HOLD_STEPS, Sums, evaluate
from .plan import RunPlan
from .signals import StopFlag

# Exit status of a run stopped by SIGTERM/SIGUSR1 after saving its checkpoint: "try again"
# (EX_TEMPFAIL in sysexits.h). Batch scripts requeue the job when they see it.
EXIT_REQUEUE = 75
# How often (iterations) the ranks agree on whether a stop was requested: each check is a
# tiny allreduce of a CPU tensor (Gloo; it never waits for the GPU), too cheap to matter every
# ten iterations, and a signal is acted on within seconds. A run alone only reads its flag.
STOP_CHECK_EVERY = 10
# torch.compile modes that replay the model as a CUDA graph: its output is overwritten at the
# next replay, so the metrics count each step's output at once instead of keeping it.
GRAPHED_MODES = ("reduce-overhead", "max-autotune")


@dataclass
class RunResult:
    run_name: str | None
    record_path: Path | None
    epochs: list[dict[str, Any]] = field(default_factory=list)
    weights_digest: str = ""
    preempted: bool = False
    completed_epochs: int = 0


def train(cfg: TrainConfig) -> RunResult:
    """Train as ``cfg`` says, on the processes the launcher started; see the module doc."""
    cfg.validate()
    if cfg.checkpoint_dir:
        checkpoint.ensure_writable(Path(cfg.checkpoint_dir))  # fail before any work is done
    dist = distributed.init(cfg.dist, fusion_threshold_mb=cfg.fusion_threshold_mb, cycle_time_ms=cfg.cycle_time_ms)
    try:
        return _train(cfg, dist)
    finally:
        dist.shutdown()


def _train(cfg: TrainConfig, dist) -> RunResult:
    import torch

    from ..data.loaders import build_data, describe, resolve_input_dtype
    from .inputs import Inputs

    _configure_torch(cfg, dist)
    torch.manual_seed(cfg.seed)
    bundle = build_data(cfg.data, image_size=cfg.image_size, synthetic_size=cfg.synthetic_size,
                        mnist1d_samples=cfg.mnist1d_samples, seed=cfg.seed,
                        input_dtype=resolve_input_dtype(cfg.input_dtype, cfg.data, dist.device.type))
    model = _model(cfg, bundle, dist.device)
    loaders = Inputs(cfg, bundle, dist)
    plan = RunPlan.make(cfg, workers=dist.size, samples_per_worker=len(loaders.sampler), data_name=describe(bundle))
    plan.check_ranks_agree(dist.allgather_object)  # a disagreement would hang the job at the first epoch's end
    st = run_state.build(cfg, plan, model, dist, data_name=bundle.name, num_classes=bundle.num_classes)
    book = RunBook(cfg, plan, framework="pytorch", prefix="[train]", is_root=dist.is_root, data=describe(bundle),
                   environment=lambda: _environment(dist, loaders), run_name=st.run_name, resume=st.loaded is not None,
                   resuming=st.resuming)
    try:
        result = _epochs(cfg, plan, st, loaders, dist, book)
    finally:
        book.close()
    result.weights_digest = weights_digest((name, p.detach().cpu().contiguous().numpy())
                                           for name, p in st.module.named_parameters())
    digests = dist.allgather_object(result.weights_digest)
    if not result.preempted:
        book.finish(completed_epochs=result.completed_epochs, digests=digests)
    return result


def _epochs(cfg, plan, st, loaders, dist, book: RunBook) -> RunResult:
    """Every epoch still to train, stopping early when a stop signal asks for it."""
    result = RunResult(run_name=book.run_name, record_path=book.record_path, completed_epochs=st.start_epoch)
    if st.start_epoch >= cfg.epochs:
        book.say(f"the checkpoint has already completed {st.start_epoch} epoch(s), --epochs is {cfg.epochs}: "
                 "nothing to train (raise --epochs to continue)")
    # Signals are caught only when there is somewhere to save: without a checkpoint
    # directory, SIGTERM keeps its default meaning (stop now).
    stop = StopFlag()
    with stop if cfg.checkpoint_dir else contextlib.nullcontext():
        for epoch in range(st.start_epoch, cfg.epochs):
            if not _epoch(cfg, plan, st, loaders, dist, book, result, epoch, stop):
                break
    return result


def _epoch(cfg, plan, st, loaders, dist, book, result, epoch: int, stop: StopFlag) -> bool:
    """Train and validate one epoch, record it, save a checkpoint; False when a stop was requested."""
    first_step = st.start_position // plan.samples_per_step if epoch == st.start_epoch else 0
    start = time.perf_counter()
    epoch_lr = st.optimizer.param_groups[0]["lr"]  # in effect at the start of the epoch
    sums, meter, step, stop_requested = _train_steps(cfg, plan, st, loaders, dist, epoch, first_step, stop)
    if stop_requested and step < plan.steps_per_epoch:  # stopped mid-epoch: save the position
        run_state.save(cfg, dist, st, book.run_name, epoch=epoch, position=step * plan.samples_per_step,
                       partial=sums.totals(dist))
        book.event("preempted", epoch=epoch, step=step, signal=stop.signum)
        book.say(f"stop requested (signal {stop.signum}): checkpoint saved at epoch {epoch} step {step}; "
                 f"exit {EXIT_REQUEUE} asks the batch script to requeue")
        result.preempted = True
        return False
    row = {"epoch": epoch + 1, "lr": epoch_lr, **_train_and_val_metrics(sums, st, loaders, dist),
           **_rates(meter), "seconds": time.perf_counter() - start}
    result.epochs.append(row)
    result.completed_epochs = epoch + 1
    book.epoch(row)
    if cfg.checkpoint_dir:
        run_state.save(cfg, dist, st, book.run_name, epoch=epoch + 1, position=0, partial=None)
    if stop_requested and epoch + 1 < cfg.epochs:  # the signal came during the last step
        book.event("preempted", epoch=epoch + 1, step=0, signal=stop.signum)
        result.preempted = True
        return False
    return True


def _train_steps(cfg, plan, st, loaders, dist, epoch: int, first_step: int, stop: StopFlag):
    """The optimizer steps of one epoch from ``first_step``; (sums, meter, steps done, stop requested)."""
    import torch
    from tqdm import tqdm

    from ..core.throughput import ThroughputMeter

    loaders.sampler.set_epoch(epoch)
    loaders.sampler.set_start(first_step * plan.samples_per_step)
    sums = Sums(dist.device, hold=1 if cfg.compile_mode in GRAPHED_MODES else HOLD_STEPS)
    if st.partial is not None and epoch == st.start_epoch and dist.is_root:
        sums.restore(st.partial)
    meter = ThroughputMeter(plan.samples_per_step, workers=plan.workers, warmup_iters=cfg.throughput_warmup_iters)
    st.model.train()
    bar = tqdm(total=plan.steps_per_epoch, initial=first_step, desc=f"epoch {epoch + 1}/{cfg.epochs}",
               disable=not (dist.is_root and cfg.progress), mininterval=2, leave=False, file=sys.stderr)
    step, stop_requested = first_step, False
    cuda = dist.device.type == "cuda"
    meter.step()  # the clock starts when the first batch is requested
    batches = loaders.train_batches()
    while step < plan.steps_per_epoch:
        first = next(batches, None)
        if first is None:
            break
        meter.mark_data_ready()
        # this step's micro-batches, read as they are needed (the plan counted enough of them)
        micro_batches = itertools.chain([first], itertools.islice(batches, plan.accumulate_steps - 1))
        _step(st, loaders.criterion, micro_batches, plan.accumulate_steps, sums)
        step += 1
        if cuda and (step == plan.steps_per_epoch or step - first_step == meter.warmup_iters):
            # The clock must see the GPU finish: at the end, and where the timing starts (the
            # host runs ahead of the GPU; queued warm-up steps must not count as measured).
            torch.cuda.synchronize()
        meter.step()
        bar.update()
        if (step % STOP_CHECK_EVERY == 0 or step == plan.steps_per_epoch) and _stop_agreed(dist, stop):
            stop_requested = True
            if step < plan.steps_per_epoch:
                break
    bar.close()
    return sums, meter, step, stop_requested


def _stop_agreed(dist, stop: StopFlag) -> bool:
    """Whether any rank saw a stop signal; all ranks must stop at the same step."""
    if dist.size == 1:
        return bool(stop.signum)
    import torch

    return dist.allreduce_mean(torch.tensor([1.0 if stop.signum else 0.0]), name="stop").item() > 0


def _step(st, criterion, micro_batches, n: int, sums: Sums) -> None:
    """One optimizer step: forward and backward for each of the ``n`` micro-batches, their
    gradients added up (gradients averaged over the ranks by the backend, once), the update.

    Each micro-batch's loss is divided by ``n``: the loss is a mean over the batch, so the sum
    of the ``n`` gradients is then the gradient of the mean over all ``n x b`` samples, what
    one batch of ``n x b`` gives (exactly, up to float rounding, for a model without
    BatchNorm: BatchNorm normalises each micro-batch by its own statistics).
    """
    st.optimizer.zero_grad()  # Horovod's wrapper takes no set_to_none; None is the default
    for i, (images, target) in enumerate(micro_batches):  # on the device already (inputs.DeviceFeed)
        with distributed.Dist.no_sync(st.wrapped, final=i == n - 1):  # DDP: reduce on the last pass only
            with st.autocast():
                output = st.model(images)
                loss = criterion(output, target)
            scaled = loss / n if n > 1 else loss
            (st.scaler.scale(scaled) if st.scaler is not None else scaled).backward()
        sums.add(loss, output, target)
    if st.scaler is not None:
        st.scaler.step(st.optimizer)
        st.scaler.update()
    else:
        st.optimizer.step()
    st.scheduler.step()


def _train_and_val_metrics(sums: Sums, st, loaders, dist) -> dict[str, float]:
    train = sums.reduced(dist)
    val = evaluate(st, loaders.val_batches(), loaders.criterion, dist)
    return {"loss": train["loss"], "train_top1_err": train["top1_err"], "train_top5_err": train["top5_err"],
            "val_loss": val["loss"], "val_top1_err": val["top1_err"], "val_top5_err": val["top5_err"]}


def _rates(meter) -> dict[str, float | None]:
    try:
        rate = meter.summary()
    except RuntimeError:  # too few iterations after the meter's warm-up
        return {"images_per_second": None, "images_per_second_per_worker": None, "data_fraction": None}
    return {"images_per_second": rate["images_per_second"],
            "images_per_second_per_worker": rate["images_per_second_per_worker"],
            "data_fraction": rate.get("data_fraction")}


def _configure_torch(cfg: TrainConfig, dist) -> None:
    import torch

    if cfg.amp == "fp16" and dist.device.type != "cuda":
        raise GuideError("--amp fp16 needs a GPU; on CPU use --amp bf16 or none")
    if dist.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # Share the cores between the ranks on this node instead of each taking all.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.local_size))
    if dist.device.type == "cuda":  # set either way: an earlier run in this process may have changed it
        on = cfg.tf32 == "on"
        torch.backends.cuda.matmul.allow_tf32 = on  # PyTorch's default: off
        torch.backends.cudnn.allow_tf32 = on or cfg.tf32 == "default"  # PyTorch's default: on
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    elif dist.device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: let cuDNN pick kernels


def _model(cfg: TrainConfig, bundle, device):
    import torch

    from .models import build_model

    model = build_model(cfg.model, num_classes=bundle.num_classes, input_shape=bundle.input_shape).to(device)
    return model.to(memory_format=torch.channels_last) if cfg.channels_last else model


def _environment(dist, loaders) -> dict[str, Any]:
    """The run's environment: the shared facts plus PyTorch's own."""
    from importlib.metadata import version

    import torch

    # The installed version, not torchvision.__version__: importing torchvision for a
    # version string costs every worker over a CPU-second (it imports all its models).
    facts: dict[str, Any] = {"torch": torch.__version__, "torchvision": version("torchvision"),
                             "device": str(dist.device), "cpu_threads": torch.get_num_threads(),
                             "gpu": torch.cuda.get_device_name(dist.device) if dist.device.type == "cuda" else None,
                             "loader_workers": loaders.workers, "input_dtype": loaders.input_dtype}
    if dist.kind == "horovod":
        facts["horovod_nccl"] = bool(dist._hvd.nccl_built())
        # what hvd.init() read: tensor fusion buffer and cycle time (Horovod 0.28.1's defaults if unset)
        facts["horovod_fusion_threshold_bytes"] = int(os.environ.get("HOROVOD_FUSION_THRESHOLD", 128 * 2**20))
        facts["horovod_cycle_time_ms"] = float(os.environ.get("HOROVOD_CYCLE_TIME", 1.0))
    return environment(dist.kind, dist.size, **facts)
