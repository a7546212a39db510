"""The training engine: the one loop every notebook, sbatch script, benchmark and test runs.

    from guide_utils.config import make_config
    from guide_utils.engine import train
    result = train(make_config("smoke", epochs=2))

The loop is the PyTorch-examples ImageNet recipe the thesis used (SGD momentum 0.9, weight
decay 1e-4, step drops at 30/60/80) plus what distributed runs need and people often get
wrong: a sampler that shards and reshuffles per epoch, rank 0's weights broadcast to all,
metrics averaged over all ranks, output from rank 0 only, the learning rate scaled to the
global batch and updated every iteration, checkpoints that survive preemption, and a run
record per run.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import platform
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import GuideError
from . import signals
from ..config import TrainConfig

# Exit status of a run stopped by SIGTERM/SIGUSR1 after saving its checkpoint: "try again"
# (EX_TEMPFAIL in sysexits.h). Batch scripts requeue the job when they see it.
EXIT_REQUEUE = 75
# How often (iterations) the ranks agree on whether a stop was requested: each check is a
# tiny allreduce, too cheap to matter every ten iterations, and a signal is acted on within
# seconds.
STOP_CHECK_EVERY = 10


@dataclass
class RunResult:
    run_name: str | None
    record_path: Path | None
    epochs: list[dict[str, Any]] = field(default_factory=list)
    weights_digest: str = ""
    preempted: bool = False
    completed_epochs: int = 0


class _StopFlag:
    """Set by SIGTERM/SIGUSR1 (what Slurm sends before the time limit with --signal)."""

    SIGNALS = signals.SIGNALS

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        # A signal during start-up (caught by signals.catch_early) stops at the first step.
        self.signum = signals.take_early_signal()
        return self

    def _handle(self, signum, _frame):
        self.signum = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def weights_digest(module) -> str:
    """A short hash of every parameter: equal digests mean identical weights.

    Buffers are left out on purpose: BatchNorm's running statistics are computed by each
    worker on its own shard (Horovod never averages them; DDP overwrites them from rank 0
    before each forward pass), so they differ between ranks by design.
    """
    h = hashlib.sha256()
    for name, tensor in module.named_parameters():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def environment(dist) -> dict[str, Any]:
    """The cheap, in-process part of the doctor's facts, recorded with every run."""
    import torch
    import torchvision

    from ..cluster.slurm import SlurmJob

    env: dict[str, Any] = {
        "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
        "torchvision": torchvision.__version__, "dist": dist.kind, "workers": dist.size,
        "device": str(dist.device), "gpu": torch.cuda.get_device_name(dist.device) if dist.device.type == "cuda" else None,
        "cpu_threads": torch.get_num_threads(),
    }
    if dist.kind == "horovod":
        import horovod

        env["horovod"] = horovod.__version__
        env["horovod_nccl"] = bool(dist._hvd.nccl_built())
    job = SlurmJob.from_env()
    env["slurm"] = asdict(job) if job else None
    return env


def _topk_correct(output, target, ks=(1, 5)):
    k_max = min(max(ks), output.shape[1])
    pred = output.topk(k_max, dim=1).indices
    hits = pred.eq(target.unsqueeze(1))
    return [hits[:, : min(k, k_max)].any(dim=1).sum() for k in ks]


class _Sums:
    """Loss and top-k hit counts, kept on the device (no sync per iteration)."""

    def __init__(self, torch, device):
        self.torch = torch
        self.t = torch.zeros(4, dtype=torch.float64, device=device)

    def add(self, loss, output, target):
        c1, c5 = _topk_correct(output.detach(), target)
        n = self.t.new_tensor(float(target.shape[0]))
        self.t += self.torch.stack([loss.detach().double() * n, c1.double(), c5.double(), n])

    def reduced(self, dist) -> dict[str, float]:
        total = dist.allreduce_mean(self.t.cpu(), name="sums") * dist.size
        loss, c1, c5, n = total.tolist()
        if n == 0:
            return {"loss": math.nan, "top1_err": math.nan, "top5_err": math.nan}
        return {"loss": loss / n, "top1_err": 100.0 * (1 - c1 / n), "top5_err": 100.0 * (1 - c5 / n)}


def train(cfg: TrainConfig) -> RunResult:
    """Train as ``cfg`` says, on the processes the launcher started; see the module doc."""
    cfg.validate()
    import torch
    from torch.utils.data import DataLoader
    from tqdm import tqdm

    from . import checkpoint

    from . import distributed

    from ..results import records
    from .data import build_data, describe
    from .models import build_model
    from .sampling import ResumableSampler, SeededItems, ShardSampler
    from ..scaling import global_batch, scaled_lr
    from ..schedules import torch_scheduler
    from ..throughput import ThroughputMeter

    if cfg.checkpoint_dir:
        checkpoint.ensure_writable(Path(cfg.checkpoint_dir))  # fail before any work is done
    dist = distributed.init(cfg.dist)
    try:
        device = dist.device
        if cfg.amp == "fp16" and device.type != "cuda":
            raise GuideError("--amp fp16 needs a GPU; on CPU use --amp bf16 or none")
        if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            # Share the cores between the ranks on this node instead of each taking all.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.local_size))
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        elif device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed input shapes: let cuDNN pick kernels

        torch.manual_seed(cfg.seed)
        bundle = build_data(cfg.data, image_size=cfg.image_size, synthetic_size=cfg.synthetic_size,
                            mnist1d_samples=cfg.mnist1d_samples, seed=cfg.seed)
        model = build_model(cfg.model, num_classes=bundle.num_classes, input_shape=bundle.input_shape).to(device)
        memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
        if cfg.channels_last:
            model = model.to(memory_format=memory_format)

        workers = dist.size
        gbatch = global_batch(cfg.per_worker_batch, workers)
        peak_lr = scaled_lr(cfg.base_lr, cfg.base_batch, gbatch, rule=cfg.lr_scaling)
        # Gradual warmup starts from the single-worker learning rate (thesis, Appendix 13).
        start_lr = cfg.warmup_start_lr()

        train_sampler = ResumableSampler(bundle.train, num_replicas=workers, rank=dist.rank, seed=cfg.seed)
        steps_per_epoch = len(train_sampler) // cfg.per_worker_batch
        if steps_per_epoch == 0:
            raise GuideError(f"{describe(bundle)}: each of {workers} worker(s) gets {len(train_sampler)} samples, "
                             f"fewer than --per-worker-batch {cfg.per_worker_batch}; use a smaller batch or fewer workers")
        if cfg.max_steps_per_epoch:
            steps_per_epoch = min(steps_per_epoch, cfg.max_steps_per_epoch)
        loader_kw: dict[str, Any] = {"num_workers": cfg.loader_workers, "pin_memory": device.type == "cuda"}
        if cfg.loader_workers > 0:
            loader_kw.update(persistent_workers=True, prefetch_factor=2)
        # Only image folders carry random augmentation that needs per-sample seeding.
        augmented = os.path.isdir(cfg.data)
        train_loader = DataLoader(SeededItems(bundle.train, cfg.seed, seeded=augmented), batch_size=cfg.per_worker_batch,
                                  sampler=train_sampler, drop_last=True, **loader_kw)
        val_loader = DataLoader(SeededItems(bundle.val, cfg.seed, seeded=False), batch_size=cfg.per_worker_batch,
                                sampler=ShardSampler(bundle.val, num_replicas=workers, rank=dist.rank), **loader_kw)

        optimizer = torch.optim.SGD(model.parameters(), lr=peak_lr, momentum=cfg.momentum,
                                    weight_decay=cfg.weight_decay)
        scaler = torch.amp.GradScaler("cuda") if cfg.amp == "fp16" else None
        meta = {"model": cfg.model, "data": bundle.name, "num_classes": bundle.num_classes,
                "per_worker_batch": cfg.per_worker_batch, "workers": workers}
        loaded = None
        if cfg.checkpoint_dir:
            loaded = checkpoint.load_latest(Path(cfg.checkpoint_dir), expect=meta, map_location="cpu")
        start_epoch, start_position, run_name, partial = 0, 0, cfg.run_name, None
        if loaded is not None:
            st = loaded.state
            model.load_state_dict(st["model"])  # on every rank: all read the same file
            start_epoch, start_position = int(st["epoch"]), int(st["position"])
            run_name = st.get("run_name") or run_name
            partial = st.get("partial")
            if scaler is not None and "scaler" in st:
                scaler.load_state_dict(st["scaler"])
        # Every rank reads the checkpoint itself (Horovod's optimizer-state broadcast would
        # first take a weight-decay step on the ranks without state), so all must see the same one.
        positions = dist.allgather_object((start_epoch, start_position))
        if len(set(positions)) > 1:
            raise GuideError(f"ranks found different checkpoints in {cfg.checkpoint_dir} ({sorted(set(positions))}); "
                             "--checkpoint-dir must be on a filesystem every node shares")
        model, optimizer = dist.prepare(model, optimizer, fp16_allreduce=cfg.fp16_allreduce)
        schedule = {"peak_lr": peak_lr, "warmup": cfg.warmup, "warmup_epochs": cfg.warmup_epochs,
                    "warmup_start_lr": start_lr if cfg.warmup == "gradual" else None,
                    "milestones": cfg.milestones, "gamma": cfg.gamma}
        scheduler = torch_scheduler(optimizer, steps_per_epoch=steps_per_epoch, **schedule)
        if loaded is not None:
            scheduler.load_state_dict(loaded.state["scheduler"])
            # Last: it restores momentum buffers and the learning rate of the next step.
            optimizer.load_state_dict(loaded.state["optimizer"])
            checkpoint.set_rng_state(loaded.state["rng"])
        module = getattr(model, "module", model)
        step_model = torch.compile(model) if cfg.compile else model
        autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16 if cfg.amp == "bf16" else torch.float16)) \
            if cfg.amp != "none" else contextlib.nullcontext

        recorder = None
        record_config = {**asdict(cfg), "workers": workers, "global_batch": gbatch, "peak_lr": peak_lr,
                         "steps_per_epoch": steps_per_epoch, "data": bundle.name}
        if dist.is_root:
            recorder = records.RunRecorder(Path(cfg.results_dir), run_name or _default_run_name(cfg, workers),
                                           config=record_config, environment=environment(dist),
                                           resume=loaded is not None and run_name is not None)
            run_name = recorder.run_name
            where = f", resuming {loaded.path.name} at epoch {start_epoch} sample {start_position}" if loaded else ""
            print(f"[train] {describe(bundle)}; model {cfg.model}; {workers} worker(s) x {cfg.per_worker_batch} = "
                  f"global batch {gbatch}; peak lr {peak_lr:g} ({cfg.lr_scaling} rule), warmup {cfg.warmup}"
                  f"{where}; record {recorder.path}", flush=True)

        criterion = torch.nn.CrossEntropyLoss()
        result = RunResult(run_name=run_name, record_path=recorder.path if recorder else None,
                           completed_epochs=start_epoch)
        if start_epoch >= cfg.epochs and dist.is_root:
            print(f"[train] the checkpoint has already completed {start_epoch} epoch(s), --epochs is {cfg.epochs}: "
                  "nothing to train (raise --epochs to continue)", flush=True)
        # Signals are caught only when there is somewhere to save: without a checkpoint
        # directory, SIGTERM keeps its default meaning (stop now).
        stop = _StopFlag()
        with stop if cfg.checkpoint_dir else contextlib.nullcontext():
            for epoch in range(start_epoch, cfg.epochs):
                train_sampler.set_epoch(epoch)
                first_step = start_position // cfg.per_worker_batch if epoch == start_epoch else 0
                train_sampler.set_start(first_step * cfg.per_worker_batch)
                sums = _Sums(torch, device)
                if partial is not None and epoch == start_epoch and dist.is_root:
                    sums.t += torch.tensor(partial, dtype=torch.float64, device=device)
                meter = ThroughputMeter(cfg.per_worker_batch, workers=workers,
                                        warmup_iters=cfg.throughput_warmup_iters)
                model.train()
                epoch_lr = optimizer.param_groups[0]["lr"]  # in effect at the start of the epoch
                epoch_start = time.perf_counter()
                bar = tqdm(total=steps_per_epoch, initial=first_step, desc=f"epoch {epoch + 1}/{cfg.epochs}",
                           disable=not (dist.is_root and cfg.progress), mininterval=2, leave=False, file=sys.stderr)
                step, preempted = first_step, False
                meter.step()  # the clock starts when the first batch is requested
                for images, target in train_loader:
                    if step >= steps_per_epoch:
                        break
                    meter.mark_data_ready()
                    images = images.to(device, non_blocking=True, memory_format=memory_format) \
                        if images.dim() == 4 else images.to(device, non_blocking=True)
                    target = target.to(device, non_blocking=True)
                    with autocast():
                        output = step_model(images)
                        loss = criterion(output, target)
                    optimizer.zero_grad()  # Horovod's wrapper takes no set_to_none; None is the default
                    if scaler is not None:
                        scaler.scale(loss).backward()
                        scaler.step(optimizer)
                        scaler.update()
                    else:
                        loss.backward()
                        optimizer.step()
                    scheduler.step()
                    sums.add(loss.float(), output.float(), target)
                    step += 1
                    if device.type == "cuda" and step == steps_per_epoch:
                        torch.cuda.synchronize()  # the clock must see the GPU finish
                    meter.step()
                    bar.update()
                    if step % STOP_CHECK_EVERY == 0 or step == steps_per_epoch:
                        # All ranks must stop at the same step: agree on whether any saw a signal.
                        flag = dist.allreduce_mean(torch.tensor([1.0 if stop.signum else 0.0]), name="stop")
                        if flag.item() > 0:
                            preempted = True
                            if step < steps_per_epoch:
                                break
                bar.close()
                if preempted and step < steps_per_epoch:
                    _save(checkpoint, cfg, dist, module, optimizer, scheduler, scaler, meta, run_name,
                          epoch=epoch, position=step * cfg.per_worker_batch,
                          partial=(dist.allreduce_mean(sums.t.cpu(), name="partial") * dist.size).tolist())
                    if recorder:
                        recorder.event("preempted", epoch=epoch, step=step, signal=stop.signum)
                        print(f"[train] stop requested (signal {stop.signum}): checkpoint saved at epoch {epoch} "
                              f"step {step}; exit {EXIT_REQUEUE} asks the batch script to requeue", flush=True)
                    result.preempted = True
                    break

                train_metrics = sums.reduced(dist)
                val_metrics = evaluate(module, val_loader, criterion, dist, device, autocast, memory_format)
                try:
                    rate = meter.summary()
                except RuntimeError:  # too few iterations after the meter's warm-up
                    rate = {"images_per_second": None, "images_per_second_per_worker": None}
                row = {"epoch": epoch + 1, "lr": epoch_lr,
                       "loss": train_metrics["loss"], "train_top1_err": train_metrics["top1_err"],
                       "train_top5_err": train_metrics["top5_err"], "val_loss": val_metrics["loss"],
                       "val_top1_err": val_metrics["top1_err"], "val_top5_err": val_metrics["top5_err"],
                       "images_per_second": rate["images_per_second"],
                       "images_per_second_per_worker": rate["images_per_second_per_worker"],
                       "data_fraction": rate.get("data_fraction"),
                       "seconds": time.perf_counter() - epoch_start}
                result.epochs.append(row)
                result.completed_epochs = epoch + 1
                if recorder:
                    recorder.epoch(**row)
                    ips = f"{row['images_per_second']:.0f} img/s" if row["images_per_second"] else "img/s n/a"
                    print(f"[train] epoch {epoch + 1}/{cfg.epochs}  lr {row['lr']:.4g}  loss {row['loss']:.4f}  "
                          f"train top-1 err {row['train_top1_err']:.2f}%  val top-1 err {row['val_top1_err']:.2f}% "
                          f"top-5 {row['val_top5_err']:.2f}%  {ips}  {row['seconds']:.1f} s", flush=True)
                if cfg.checkpoint_dir:
                    _save(checkpoint, cfg, dist, module, optimizer, scheduler, scaler, meta, run_name,
                          epoch=epoch + 1, position=0, partial=None)
                if preempted and epoch + 1 < cfg.epochs:  # the signal came during the last step
                    if recorder:
                        recorder.event("preempted", epoch=epoch + 1, step=0, signal=stop.signum)
                    result.preempted = True
                    break

        result.weights_digest = weights_digest(module)
        digests = dist.allgather_object(result.weights_digest)
        if recorder and not result.preempted:
            recorder.summary(completed_epochs=result.completed_epochs, weights_digests=digests,
                             ranks_agree=len(set(digests)) == 1,
                             best_val_top1_err=min((r["val_top1_err"] for r in result.epochs), default=None))
        return result
    finally:
        dist.shutdown()


def evaluate(module, loader, criterion, dist, device, autocast, memory_format) -> dict[str, float]:
    """Validation loss and top-1/top-5 error over the whole validation set, all ranks summed."""
    import torch

    module.eval()
    sums = _Sums(torch, device)
    with torch.no_grad():
        for images, target in loader:
            images = images.to(device, memory_format=memory_format) if images.dim() == 4 else images.to(device)
            target = target.to(device)
            with autocast():
                output = module(images)
                loss = criterion(output, target)
            sums.add(loss.float(), output.float(), target)
    return sums.reduced(dist)


def _save(checkpoint, cfg, dist, module, optimizer, scheduler, scaler, meta, run_name, *, epoch, position, partial):
    if not dist.is_root:
        return
    state = {"meta": meta, "model": module.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "epoch": epoch, "position": position,
             "rng": checkpoint.rng_state(), "run_name": run_name}
    if partial is not None:
        state["partial"] = partial
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    step = position // cfg.per_worker_batch if position else None
    checkpoint.save(Path(cfg.checkpoint_dir), state, epoch=epoch, step=step, keep=cfg.keep_checkpoints)


def _default_run_name(cfg: TrainConfig, workers: int) -> str:
    data = Path(cfg.data).name if cfg.data not in ("synthetic", "mnist1d") else cfg.data
    name = f"{cfg.model}-{data}-{cfg.dist}-{workers}x{cfg.per_worker_batch}-{cfg.lr_scaling}-{cfg.warmup}"
    if cfg.warmup != "none":
        name += str(cfg.warmup_epochs)
    return f"{name}-seed{cfg.seed}"
