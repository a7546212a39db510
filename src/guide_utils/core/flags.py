"""The training flags, once: the parser both engines' commands use (``python -m
guide_utils.train`` and ``train_tf``, the benchmarks, the tuning helpers) and the one way
from those flags to a :class:`~guide_utils.core.config.TrainConfig`.

Every flag defaults to the chosen profile's value, so ``--profile smoke --epochs 3`` is the
smoke profile with three epochs.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Mapping

from .cli import ArgumentParser
from .config import PROFILES, TrainConfig, make_config

PROG = "python -m guide_utils.train"


def _defaults(name: str) -> str:
    base = getattr(TrainConfig(), name)
    smoke = PROFILES["smoke"].get(name, base)
    def fmt(v) -> str:
        return " ".join(map(str, v)) if isinstance(v, tuple) else str(v)

    return f"(full: {fmt(base)}; smoke: {fmt(smoke)})" if smoke != base else f"(default: {fmt(base)})"


def build_parser(prog: str = PROG, description: str = "") -> ArgumentParser:
    """The training command's parser: ``--profile`` and one flag per TrainConfig setting."""
    p = ArgumentParser(prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=description,
                       epilog="Exit status: 0 done; 2 bad input; 75 preempted after a checkpoint (resume by "
                              "rerunning with the same --checkpoint-dir).")
    p.add_argument("--profile", choices=sorted(PROFILES), default="full",
                   help="settings every other flag starts from (default: full)")
    g = p.add_argument_group("model and data")
    g.add_argument("--model", help="torchvision name (e.g. resnet50), small_resnet, mnist1d_cnn, mnist1d_mlp or linear "
                   + _defaults("model"))
    g.add_argument("--data", help="synthetic or synthetic-loader (random ImageNet-shaped images through the "
                                  "DataLoader: compute plus input path), synthetic-resident (one random batch "
                                  "on the device, reused: compute only), mnist1d (generated offline), "
                                  "digits (scikit-learn's 8x8 images), or a directory with train/ and val/ "
                                  "class folders (full: required, never guessed; smoke: mnist1d)")
    g.add_argument("--image-size", type=int, help="crop size for image data " + _defaults("image_size"))
    g.add_argument("--synthetic-size", type=int, help="samples per epoch with --data synthetic "
                   + _defaults("synthetic_size"))
    g.add_argument("--mnist1d-samples", type=int, help="MNIST-1D samples to generate (80%% train) "
                   + _defaults("mnist1d_samples"))
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, help=_defaults("epochs"))
    g.add_argument("--per-worker-batch", type=int, help="samples per worker per step " + _defaults("per_worker_batch"))
    g.add_argument("--accumulate-steps", type=int, metavar="N",
                   help="add the gradients of N batches before each optimizer step: global batch = workers x "
                        "--per-worker-batch x N, so half the GPUs with N=2 keep the global batch, its learning "
                        "rate and its schedule " + _defaults("accumulate_steps"))
    g.add_argument("--base-lr", type=float, help="learning rate at --base-batch " + _defaults("base_lr"))
    g.add_argument("--base-batch", type=int, help="global batch --base-lr was tuned for " + _defaults("base_batch"))
    g.add_argument("--lr-scaling", choices=["none", "linear", "sqrt"],
                   help="how the learning rate follows the global batch " + _defaults("lr_scaling"))
    g.add_argument("--warmup", choices=["none", "stepping", "gradual"],
                   help="stepping: thesis Appendix 9; gradual: Appendix 13 " + _defaults("warmup"))
    g.add_argument("--warmup-epochs", type=int, help=_defaults("warmup_epochs"))
    g.add_argument("--warmup-start-batch", type=int,
                   help="gradual warmup starts at the lr of this batch (default: the per-worker batch, "
                        "i.e. one worker's lr; set it when one process emulates several workers)")
    g.add_argument("--milestones", type=int, nargs="+", help="epochs where lr is multiplied by --gamma "
                   + _defaults("milestones"))
    g.add_argument("--gamma", type=float, help=_defaults("gamma"))
    g.add_argument("--optimizer", choices=["sgd", "lars", "lamb"],
                   help="sgd (the thesis's); lars or lamb: layer-wise adaptive rates for very large batches "
                        "(timm's implementations) " + _defaults("optimizer"))
    g.add_argument("--momentum", type=float, help="(sgd and lars) " + _defaults("momentum"))
    g.add_argument("--weight-decay", type=float, help=_defaults("weight_decay"))
    g.add_argument("--seed", type=int, help=_defaults("seed"))
    g.add_argument("--max-steps-per-epoch", type=int, help="stop each epoch early (benchmarks, quick looks)")
    g = p.add_argument_group("distribution and input pipeline")
    g.add_argument("--dist", choices=["none", "horovod", "ddp"],
                   help="horovod: start with horovodrun/mpirun/srun; ddp: torchrun or srun " + _defaults("dist"))
    g.add_argument("--loader-workers", type=_workers, metavar="N|auto",
                   help="DataLoader worker processes per rank; auto: on a GPU the CPUs the rank has less one "
                        "(at most 16), on a CPU 4 " + _defaults("loader_workers"))
    g.add_argument("--input-dtype", choices=["auto", "float32", "uint8"],
                   help="how images cross to the device: uint8, converted and normalised there, or float32 "
                        "from the loader workers; auto: uint8 for images on a GPU, float32 on a CPU "
                        + _defaults("input_dtype"))
    _performance_flags(p)
    g = p.add_argument_group("outputs")
    g.add_argument("--results-dir", help="where the run record (JSON lines) goes " + _defaults("results_dir"))
    g.add_argument("--run-name", help="record name (default: derived from the settings; never overwrites)")
    g.add_argument("--checkpoint-dir", help="save every epoch and on SIGTERM/SIGUSR1; resume from the newest")
    g.add_argument("--keep-checkpoints", type=int, help=_defaults("keep_checkpoints"))
    g.add_argument("--no-progress", dest="progress", action="store_const", const=False, help="no progress bar")
    g.add_argument("--quiet", action="store_const", const=True,
                   help="no line per epoch; the run record still has every epoch")
    return p


def _performance_flags(p: ArgumentParser) -> None:
    g = p.add_argument_group("performance switches (off by default where they change numerics)")
    g.add_argument("--amp", choices=["none", "bf16", "fp16"], help="mixed precision autocast " + _defaults("amp"))
    g.add_argument("--channels-last", action="store_const", const=True,
                   help="NHWC memory layout (faster convs on GPUs)")
    g.add_argument("--compile", action="store_const", const=True, help="torch.compile the model")
    g.add_argument("--compile-mode",
                   choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                   help="torch.compile's mode (implies --compile); reduce-overhead adds CUDA graphs on a GPU")
    g.add_argument("--tf32", choices=["default", "on", "off"],
                   help="TensorFloat-32 on Ampere and later GPUs: on (matmuls and convolutions), off (strict fp32), "
                        "default (PyTorch's: cuDNN convolutions only) " + _defaults("tf32"))
    g.add_argument("--fp16-allreduce", action="store_const", const=True,
                   help="send gradients as fp16 (Horovod's compression; DDP's fp16_compress_hook)")
    g.add_argument("--ddp-bucket-mb", type=float, help="DDP: gradient bucket size in MB (default: PyTorch's 25)")
    g.add_argument("--fusion-threshold-mb", type=float,
                   help="Horovod: tensor fusion buffer in MiB, 0 disables fusion (default: Horovod's 128)")
    g.add_argument("--cycle-time-ms", type=float, help="Horovod: background cycle in ms (default: Horovod's 1)")
    g.add_argument("--deterministic", action="store_const", const=True,
                   help="deterministic algorithms, no cuDNN autotuning (slower; for exact reproduction)")
    g.add_argument("--monitor", type=float, nargs="?", const=1.0, metavar="SECONDS",
                   help="sample CPU, memory, I/O and GPU utilisation every SECONDS (default 1) into the run record")


def _workers(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or auto, got {text!r}") from None


def to_config(args: Mapping[str, Any] | argparse.Namespace) -> TrainConfig:
    """The TrainConfig for parsed training flags: the profile, then every flag that was given."""
    values = dict(vars(args) if isinstance(args, argparse.Namespace) else args)
    profile = values.pop("profile", "full")
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    return make_config(profile, **{k: v for k, v in values.items() if k in fields})  # None: not given


def config_from_argv(argv: list[str] | None, parser: ArgumentParser | None = None) -> TrainConfig:
    """``argv`` (training flags, as typed after ``python -m guide_utils.train``) as a TrainConfig."""
    return to_config((parser or build_parser()).parse_args(argv))
