"""Step-wise tuning, measured: one engine switch at a time, in the Summit paper's order.

Yin et al. (DLS 2019) tuned ResNet-50 on Summit in three stages, and recommend the same order
to users: the compute kernels first, then the input pipeline (data format and staging to
node-local storage), then communication. :data:`STEPS` is that walk for the guide's engine,
each step one switch measured against the configuration before it in the same run
(alternating, repeated, medians). A switch that does not win by more than ``min_gain`` is
reported and *not* kept; a step marked ``always`` changes the situation (real data instead
of synthetic, two workers instead of one) and is kept whatever it costs, because that cost is
what the next steps have to win back.

:func:`device_steps` is the same order for the compute kernels on whatever device the walk
finds, GPU first in mind: fp32 -> TF32 -> bf16 autocast -> channels_last -> torch.compile ->
CUDA graphs, on a batch resident on the device (compute only), then the input path: the
loader-fed batches, loader workers, uint8 batches normalised on the device. On a CPU the
GPU-only steps (TF32, CUDA graphs) are skipped with the reason.

``benchmarks/stepwise_tuning.py`` runs the walk and records it; chapter 12 shows the record,
re-measures one step live, profiles a step with ``torch.profiler`` and shows the utilisation
of an input-bound and a compute-bound run (``--monitor``).
"""

from __future__ import annotations

import os
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..core.errors import GuideError
from .runs import Setup, throughput

BASE = {"--profile": "full", "--model": "resnet18", "--data": "synthetic", "--image-size": "64",
        "--per-worker-batch": "32", "--epochs": "1", "--max-steps-per-epoch": "20", "--loader-workers": "0",
        "--synthetic-size": "1024"}


@dataclass(frozen=True)
class Step:
    stage: str  # "compute kernels", "input pipeline" or "communication"
    name: str
    flags: tuple[tuple[str, str | None], ...]  # engine flags set by this step (None: a switch without value)
    always: bool = False  # kept whatever it measures: it changes the situation, not the tuning
    workers: int = 1
    note: str = ""


def steps(data: dict[str, str] | None = None) -> list[Step]:
    """The walk. ``data`` names the prepared datasets: ``jpeg`` (an ImageFolder of JPEGs),
    ``shards`` (the same pre-decoded) and ``staged`` (the shards copied to node-local disk)."""
    data = data or {"jpeg": "JPEG_DIR", "shards": "SHARDS_DIR", "staged": "STAGED_DIR"}
    return [
        Step("compute kernels", "channels_last", (("--channels-last", None),), note="NHWC memory layout"),
        Step("compute kernels", "bf16 autocast", (("--amp", "bf16"),), note="bfloat16 matmuls and convolutions"),
        Step("compute kernels", "torch.compile", (("--compile", None),), note="inductor-generated kernels"),
        Step("input pipeline", "real JPEG images", (("--data", data["jpeg"]),), always=True,
             note="ImageFolder of JPEGs decoded and augmented in the loop, instead of synthetic tensors"),
        Step("input pipeline", "2 loader workers", (("--loader-workers", "2"),),
             note="decoding in 2 DataLoader processes beside the training"),
        Step("input pipeline", "pre-decoded shards", (("--data", data["shards"]),),
             note="uint8 arrays decoded once, instead of JPEG files"),
        Step("input pipeline", "staged to local disk", (("--data", data["staged"]),),
             note="the same shards copied to node-local scratch first"),
        Step("communication", "2 workers (DDP)", (("--dist", "ddp"),), always=True, workers=2,
             note="two processes of one thread each instead of one process of two"),
        Step("communication", "fp16 allreduce", (("--fp16-allreduce", None),), workers=2,
             note="gradients sent as fp16 (fp16_compress_hook)"),
    ]


# The device walk's start: strict fp32 on a resident batch, no loader workers.
DEVICE_BASE = {"--profile": "full", "--model": "resnet50", "--data": "synthetic-resident", "--image-size": "224",
               "--per-worker-batch": "128", "--epochs": "1", "--max-steps-per-epoch": "30", "--loader-workers": "0",
               "--synthetic-size": "4096", "--tf32": "off", "--input-dtype": "float32"}


def device_steps(device_type: str) -> tuple[list[Step], list[tuple[str, str]]]:
    """The kernel-then-input walk for ``device_type`` ("cuda" or "cpu"): (steps, skipped
    steps with the reason)."""
    gpu = [
        (Step("compute kernels", "TF32", (("--tf32", "on"),), note="TensorFloat-32 matmuls and convolutions"),
         "TF32 is a GPU number format (Ampere and later); a CPU computes fp32"),
        (Step("compute kernels", "bf16 autocast", (("--amp", "bf16"),), note="bfloat16 matmuls and convolutions"),
         None),
        (Step("compute kernels", "channels_last", (("--channels-last", None),), note="NHWC memory layout"), None),
        (Step("compute kernels", "torch.compile", (("--compile", None),), note="inductor-generated kernels"), None),
        (Step("compute kernels", "CUDA graphs", (("--compile-mode", "reduce-overhead"),),
              note="torch.compile's reduce-overhead mode: the step's kernels replayed as one graph"),
         "CUDA graphs replay GPU kernel launches; a CPU has none to save"),
        (Step("input pipeline", "fed by the loader", (("--data", "synthetic-loader"),), always=True,
              note="float32 batches from a DataLoader in the main process instead of the resident batch"), None),
        (Step("input pipeline", "loader workers", (("--loader-workers", "auto"),),
              note="batches assembled by DataLoader worker processes (auto: the CPUs per GPU less one)"), None),
        (Step("input pipeline", "uint8 input", (("--input-dtype", "uint8"),),
              note="uint8 batches, converted and normalised on the device"), None),
    ]
    steps = [s for s, why in gpu if device_type == "cuda" or why is None]
    skipped = [(s.name, why) for s, why in gpu if device_type != "cuda" and why is not None]
    return steps, skipped


def measure_here(flags: dict[str, str | None], workers: int = 1) -> float:
    """Images/s of one engine run of ``flags`` in this process (the device walk: no start-up
    per measurement, one process holding the GPU)."""
    import tempfile

    steps = int(flags.get("--max-steps-per-epoch") or 20)
    with tempfile.TemporaryDirectory() as results:
        # a third of a short run is warm-up (cuDNN's autotuning, the allocator), at most 10 steps
        rate = run_here(flags, results, throughput_warmup_iters=max(1, min(10, steps // 3))).epochs.iloc[0][
            "images_per_second"]
    if rate is None or rate != rate:
        raise GuideError(f"no throughput measured in {steps} steps; give the walk more --steps")
    return float(rate)


def argv(flags: dict[str, str | None]) -> list[str]:
    out = []
    for k, v in flags.items():
        out += [k] if v is None else [k, v]
    return out


def _setup(name: str, flags: dict[str, str | None], workers: int) -> Setup:
    f = {k: v for k, v in flags.items() if k != "--dist"}
    if workers == 1:
        return Setup(name, 1, "alone", tuple(argv(f)))
    return Setup(name, workers, "torchrun", tuple(argv(f)))


def walk(walk_steps: list[Step], *, repeats: int = 3, min_gain: float = 0.02, base: dict | None = None,
         progress: Callable[[str], None] | None = None, measure: Callable[[dict, int], float] | None = None,
         on_row: Callable[[dict], None] | None = None) -> list[dict[str, Any]]:
    """Measure every step against the configuration before it; one row per step.
    ``measure(flags, workers)`` gives images/s (default: a fresh process per run);
    ``on_row`` sees each row as soon as it is measured."""
    measure = measure or (lambda flags, workers: throughput(_setup("run", flags, workers), []))
    kept: dict[str, str | None] = dict(base or BASE)
    workers, rows = 1, []
    for step in walk_steps:
        trial = {**kept, **dict(step.flags)}
        runs = {"before": (kept, workers), "after": (trial, step.workers)}
        rates: dict[str, list[float]] = {"before": [], "after": []}
        for r in range(repeats):
            for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
                rates[name].append(measure(*runs[name]))
        ratio = statistics.median(a / b for a, b in zip(rates["after"], rates["before"]))
        keep = step.always or ratio >= 1 + min_gain
        rows.append({"stage": step.stage, "step": step.name, "note": step.note, "workers": step.workers,
                     "before_images_per_second": statistics.median(rates["before"]),
                     "after_images_per_second": statistics.median(rates["after"]), "ratio": ratio, "kept": keep,
                     "before_runs": [round(x, 1) for x in rates["before"]],
                     "after_runs": [round(x, 1) for x in rates["after"]], "flags": argv(dict(step.flags))})
        if progress:
            progress(f"{step.stage:<16} {step.name:<22} x{ratio:.3f} {'kept' if keep else 'not kept'}")
        if on_row:
            on_row(rows[-1])
        if keep:
            kept, workers = trial, step.workers
    return rows


def repeats(rows: list[dict[str, Any]]):
    """A recorded walk as a table, with what it says about its own noise. Each step's *before*
    is a configuration measured once already, as the previous step's *after* (or its *before*,
    when that switch was dropped): ``repeat`` is the relative difference of the two, ``noise``
    the largest ``|repeat|`` of the step's stage (a stage's first step measures the previous
    stage's configuration and counts there), and ``finding`` whether the step's ratio lies
    further from 1 than its stage's noise."""
    import pandas as pd

    walk = pd.DataFrame(rows)
    prev = walk.shift(1)
    same = prev["after_images_per_second"].where(prev["kept"].eq(True), prev["before_images_per_second"])
    walk["repeat"] = walk["before_images_per_second"] / same - 1
    measured_in = prev["stage"].fillna(walk["stage"])  # the stage whose configuration was repeated
    walk["noise"] = walk["stage"].map(walk["repeat"].abs().groupby(measured_in).max()).fillna(0.0)
    walk["finding"] = (walk["ratio"] - 1).abs() > walk["noise"]
    return walk


def prepare_data(root: Path, *, per_class: int = 512, size: int = 256, image_size: int = 72) -> dict[str, str]:
    """The walk's datasets under ``root``: the JPEG folder (the "shared filesystem" copy), its
    pre-decoded shards, and the shards staged to ``root/local-scratch`` as a job would."""
    from ..data.datasets import make_jpeg_folder, write_shards

    root = Path(root)
    jpeg = make_jpeg_folder(root / "shared" / "photos-jpeg", per_class=per_class, size=size)
    shards = root / "shared" / "photos-shards"
    if not (shards / "shards.json").exists():
        write_shards(jpeg, shards, image_size=image_size)
    staged = root / "local-scratch" / "photos-shards"
    if not (staged / "shards.json").exists():
        shutil.copytree(shards, staged, dirs_exist_ok=True)
    return {"jpeg": str(jpeg), "shards": str(shards), "staged": str(staged)}


def profile_step(model: str = "resnet18", *, batch: int = 32, image_size: int = 64, steps: int = 3, top: int = 12,
                 channels_last: bool = False, amp: str = "none"):
    """Where one training step's time goes: ``torch.profiler`` over ``steps`` steps of
    forward, backward and SGD update on random images; the ``top`` operators by their own CPU
    time, as a DataFrame (operator, calls, self seconds, share of the step)."""
    import contextlib

    import pandas as pd
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from ..engine.models import build_model

    if not torch.cuda.is_available():
        # A CUDA build of torch on a machine without a GPU: the profiler's library logs
        # "gpuGetDeviceCount failed" as an ERROR although only the CPU is profiled. Where
        # a GPU is usable its messages are kept.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    net = build_model(model, num_classes=1000, input_shape=(3, image_size, image_size))
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = net.to(memory_format=fmt).train()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(batch, 3, image_size, image_size).to(memory_format=fmt)
    y = torch.randint(0, 1000, (batch,))
    cast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if amp == "bf16" else contextlib.nullcontext
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=steps)) as prof:
        for _ in range(steps + 2):
            with cast():
                loss = torch.nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    total = sum(e.self_cpu_time_total for e in events)
    rows = [{"operator": e.key, "calls": e.count // steps, "self_ms_per_step": e.self_cpu_time_total / steps / 1e3,
             "share": e.self_cpu_time_total / total} for e in events]
    return pd.DataFrame(rows).sort_values("self_ms_per_step", ascending=False).head(top).reset_index(drop=True)


def config(flags: dict[str, str | None] | list[str]):
    """The engine's TrainConfig for these command-line flags, as ``python -m guide_utils.train`` builds it."""
    from ..core.flags import config_from_argv

    return config_from_argv(argv(flags) if isinstance(flags, dict) else list(flags))


def run_here(flags: dict[str, str | None], results_dir: str | Path, **overrides):
    """Train ``flags`` in this process (no start-up cost: for quick looks in a notebook);
    its run record."""
    import dataclasses

    from ..engine import train
    from ..core.records import read_run

    cfg = dataclasses.replace(config(flags), results_dir=str(results_dir), progress=False, **overrides)
    return read_run(train(cfg).record_path)


# The GPU-only compute switch, as NVIDIA measured it for ResNet-50 v1.5 in PyTorch (images/s,
# pytorch-21.03 NGC container): the "Training performance results" tables of
# NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md (checked at
# commit 291f0d02). This guide's machine has no GPU to measure them on.
GPU_PUBLISHED = [
    {"gpu": "A100 80GB (DGX A100)", "gpus": 1, "before": "TF32", "after": "AMP", "before_ips": 938,
     "after_ips": 2470},
    {"gpu": "A100 80GB (DGX A100)", "gpus": 8, "before": "TF32", "after": "AMP", "before_ips": 7248,
     "after_ips": 16621},
    {"gpu": "V100 16GB (DGX-1)", "gpus": 1, "before": "FP32", "after": "AMP", "before_ips": 367,
     "after_ips": 1200},
    {"gpu": "V100 16GB (DGX-1)", "gpus": 8, "before": "FP32", "after": "AMP", "before_ips": 2855,
     "after_ips": 8322},
]


def gpu_published():
    """:data:`GPU_PUBLISHED` as a DataFrame with the speed-up of each switch."""
    import pandas as pd

    t = pd.DataFrame(GPU_PUBLISHED)
    return t.assign(ratio=t["after_ips"] / t["before_ips"],
                    source="NVIDIA DeepLearningExamples, RN50 v1.5 PyTorch")
