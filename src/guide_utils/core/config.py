"""Training settings in one place: the full (cluster) profile and the smoke (laptop) profile.

The ``full`` profile is the thesis's setting (ResNet-50, ImageNet-shaped data, 90 epochs,
SGD momentum 0.9, weight decay 1e-4, base learning rate 0.1 for batch 256, drops at epochs
30/60/80). The ``smoke`` profile changes only what must change to finish in seconds on two
CPU cores; everything else is inherited, so a smoke run exercises the same code paths.

>>> cfg = make_config("smoke", epochs=2)
>>> (cfg.model, cfg.data, cfg.epochs, cfg.base_lr)
('mnist1d_cnn', 'mnist1d', 2, 0.1)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .errors import GuideError


@dataclass
class TrainConfig:
    # what is trained on what
    model: str = "resnet50"
    # "synthetic" (= "synthetic-loader"), "synthetic-resident", "mnist1d", "digits" or an
    # ImageFolder directory (or pre-decoded shards). None (the full profile's):
    # not chosen, and the run refuses to start, so that a cluster job without its dataset
    # never trains for days on random images; synthetic data must be asked for by name.
    data: str | None = None
    image_size: int = 224
    synthetic_size: int = 10240  # samples per synthetic "epoch" (per job, split over workers)
    mnist1d_samples: int = 20000
    # optimisation (thesis, Appendix 5)
    epochs: int = 90
    per_worker_batch: int = 128
    # Gradient accumulation: each worker adds the gradients of this many micro-batches of
    # per_worker_batch before one optimizer step, so the global batch (and with it the scaled
    # learning rate and the schedule) is workers x per_worker_batch x accumulate_steps. It
    # keeps the global batch when the GPU count shrinks, or when a batch does not fit.
    accumulate_steps: int = 1
    base_lr: float = 0.1
    base_batch: int = 256
    lr_scaling: str = "linear"
    warmup: str = "none"
    warmup_epochs: int = 5
    # Gradual warmup starts at the linearly scaled lr of this batch; None: the per-worker
    # batch (one worker's lr, thesis Appendix 13). Set it when one process emulates k workers.
    warmup_start_batch: int | None = None
    milestones: tuple[int, ...] = (30, 60, 80)
    gamma: float = 0.1
    # sgd (the thesis's); lars or lamb: layer-wise adaptive rates for very large batches
    # (You et al. 2017, 2019), timm's implementations
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 1e-4
    seed: int = 0
    max_steps_per_epoch: int | None = None  # cap for benchmarks and quick looks
    # distribution and input pipeline
    dist: str = "none"
    # DataLoader processes per rank; "auto": on a GPU the CPUs the rank has, less one (at
    # most 16), on a CPU 4 (runtime.cpus.default_loader_workers)
    loader_workers: int | str = "auto"
    # how images cross to the device: "uint8" (normalised there), "float32" (normalised by
    # the loader workers), "auto": uint8 for image data on a GPU, float32 on a CPU
    input_dtype: str = "auto"
    # performance switches; off by default where they change numerics
    amp: str = "none"  # "bf16" or "fp16" (fp16 on GPU only)
    channels_last: bool = False
    compile: bool = False
    compile_mode: str | None = None  # torch.compile mode; "reduce-overhead" adds CUDA graphs
    # TensorFloat-32 on Ampere and later GPUs: "on" (matmuls and convolutions), "off" (strict
    # fp32), "default" (PyTorch's: convolutions through cuDNN use it, matmuls do not)
    tf32: str = "default"
    fp16_allreduce: bool = False  # Horovod's fp16 compression; DDP's fp16_compress_hook
    # how gradients are grouped for the allreduce; None: the library's own default
    ddp_bucket_mb: float | None = None  # DDP bucket_cap_mb (PyTorch: 25)
    fusion_threshold_mb: float | None = None  # Horovod tensor fusion buffer (0.28.1: 128; 0 disables fusion)
    cycle_time_ms: float | None = None  # Horovod background cycle (0.28.1: 1)
    deterministic: bool = False
    # where things go
    results_dir: str = "results"
    run_name: str | None = None
    checkpoint_dir: str | None = None
    keep_checkpoints: int = 3
    throughput_warmup_iters: int = 10
    progress: bool = True
    monitor: float | None = None  # seconds between utilisation samples in the record; None: off
    # Print no line per epoch (and not the opening line with the record's path): notebooks
    # train quietly and print one table from the run records instead.
    quiet: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # free-form labels recorded with the run

    def validate(self) -> "TrainConfig":
        """Raise GuideError for settings that cannot work, before anything starts."""
        if not self.data:
            raise GuideError(NO_DATA)
        if self.per_worker_batch <= 0:
            raise GuideError(f"--per-worker-batch must be a positive integer, got {self.per_worker_batch}")
        if isinstance(self.accumulate_steps, bool) or not isinstance(self.accumulate_steps, int) \
                or self.accumulate_steps <= 0:
            raise GuideError(f"--accumulate-steps must be a positive integer (1: no accumulation), "
                             f"got {self.accumulate_steps}")
        if self.epochs <= 0:
            raise GuideError(f"--epochs must be positive, got {self.epochs}")
        if self.base_lr <= 0 or self.base_batch <= 0:
            raise GuideError("--base-lr and --base-batch must be positive")
        if self.loader_workers != "auto" and (isinstance(self.loader_workers, bool)
                                               or not isinstance(self.loader_workers, int) or self.loader_workers < 0):
            raise GuideError(f"--loader-workers must be auto or 0 or more, got {self.loader_workers}")
        if self.input_dtype not in INPUT_DTYPES:
            raise GuideError(f"--input-dtype must be {', '.join(INPUT_DTYPES)}, got {self.input_dtype!r}")
        if self.tf32 not in ("default", "on", "off"):
            raise GuideError(f"--tf32 must be default, on or off, got {self.tf32!r}")
        if self.compile_mode not in COMPILE_MODES:
            raise GuideError(f"--compile-mode must be one of {', '.join(m for m in COMPILE_MODES if m)}, "
                             f"got {self.compile_mode!r}")
        if self.max_steps_per_epoch is not None and self.max_steps_per_epoch <= 0:
            raise GuideError(f"--max-steps-per-epoch must be positive, got {self.max_steps_per_epoch}")
        if self.keep_checkpoints <= 0:
            raise GuideError(f"--keep-checkpoints must be at least 1, got {self.keep_checkpoints}")
        if self.amp not in ("none", "bf16", "fp16"):
            raise GuideError(f"--amp must be none, bf16 or fp16, got {self.amp!r}")
        if self.warmup != "none" and self.milestones and self.warmup_epochs > min(self.milestones):
            raise GuideError(f"--warmup-epochs {self.warmup_epochs} must not exceed the first milestone "
                             f"{min(self.milestones)}: the learning-rate drop would happen during warmup")
        if self.warmup_start_batch is not None and self.warmup_start_batch <= 0:
            raise GuideError(f"--warmup-start-batch must be positive, got {self.warmup_start_batch}")
        if self.optimizer not in OPTIMIZERS:
            raise GuideError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.monitor is not None and not 0.05 <= self.monitor <= 3600:
            raise GuideError(f"--monitor takes the seconds between samples, 0.05 to 3600, got {self.monitor}")
        if self.ddp_bucket_mb is not None and not self.ddp_bucket_mb > 0:
            raise GuideError(f"--ddp-bucket-mb must be positive, got {self.ddp_bucket_mb}")
        if self.fusion_threshold_mb is not None and self.fusion_threshold_mb < 0:
            raise GuideError(f"--fusion-threshold-mb must be 0 (no fusion) or more, got {self.fusion_threshold_mb}")
        if self.cycle_time_ms is not None and not 0 < self.cycle_time_ms <= 1000:
            raise GuideError(f"--cycle-time-ms is in milliseconds, 0 to 1000, got {self.cycle_time_ms}")
        if not 0 < self.gamma <= 1:
            raise GuideError(f"--gamma must be in (0, 1], got {self.gamma}")
        if self.momentum < 0 or self.weight_decay < 0:
            raise GuideError("--momentum and --weight-decay must not be negative")
        if any(m <= 0 for m in self.milestones) or list(self.milestones) != sorted(set(self.milestones)):
            raise GuideError(f"--milestones must be positive and increasing, got {' '.join(map(str, self.milestones))}")
        if not isinstance(self.quiet, bool):
            raise GuideError(f"quiet must be True or False, got {self.quiet!r}")
        if self.image_size < 8:
            raise GuideError(f"--image-size must be at least 8, got {self.image_size}")
        return self


    def warmup_start_lr(self) -> float:
        """Where gradual warmup starts: the lr the scaling rule gives ``warmup_start_batch``."""
        from .scaling import scaled_lr

        return scaled_lr(self.base_lr, self.base_batch, self.warmup_start_batch or self.per_worker_batch,
                         rule=self.lr_scaling)


OPTIMIZERS = ("sgd", "lars", "lamb")
INPUT_DTYPES = ("auto", "float32", "uint8")
COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
NO_DATA = ("no dataset: the full profile trains on ImageNet and will not guess it; pass --data DIR "
           "(DIR/train/<class>/* and DIR/val/<class>/*; the sbatch examples pass the staged copy of "
           "GUIDE_DATASET_ARCHIVE, which python -m guide_utils prepare-imagenet makes), or --data synthetic "
           "for random images (speed only)")

PROFILES: dict[str, dict[str, Any]] = {
    "full": {},
    # MNIST-1D (generated offline) with a small 1-D CNN: seconds per epoch on 2 cores.
    "smoke": {
        "model": "mnist1d_cnn",
        "data": "mnist1d",
        "mnist1d_samples": 4000,
        "epochs": 4,
        "per_worker_batch": 32,
        "warmup_epochs": 1,
        "milestones": (2, 3),
        "loader_workers": 0,
        "throughput_warmup_iters": 5,
    },
}


def make_config(profile: str = "full", **overrides: Any) -> TrainConfig:
    """The named profile with ``overrides`` applied (None values are ignored)."""
    if profile not in PROFILES:
        raise GuideError(f"unknown profile {profile!r}; choose from {', '.join(PROFILES)}")
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = set(overrides) - fields
    if unknown:
        raise GuideError(f"unknown setting(s) {', '.join(sorted(unknown))}")
    values = {**PROFILES[profile], **{k: v for k, v in overrides.items() if v is not None}}
    if "milestones" in values:
        values["milestones"] = tuple(values["milestones"])
    return TrainConfig(**values)
