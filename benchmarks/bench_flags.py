"""The benchmarks' command lines: the training flags of ``python -m guide_utils.train``
(guide_utils.core.flags), defaulting to a short run on synthetic images, plus the timing
flags they all take. A benchmark adds its own flags to the group this returns beside the
parser; one that a training flag also names replaces it there.

    p, own = parser("python benchmarks/x.py", __doc__, steps=60, warmup=10)
    own.add_argument("--repeats", type=int, default=3)
    args = parse(p, argv)
    cfg = timed_config(args, monitor=1.0)
"""

from __future__ import annotations

from guide_utils.core.flags import build_parser, to_config

# What the benchmarks measure unless told otherwise: a small model on small images, one
# process, no DataLoader workers (a laptop's CPU; the docstrings show the GPU command lines).
DEFAULTS = {"model": "small_resnet", "image_size": 32, "per_worker_batch": 64, "loader_workers": 0}


def parser(prog: str, doc: str, *, steps: int, warmup: int):
    """``(parser, group)``: the training flags (``--profile full`` and :data:`DEFAULTS`
    underneath), and the benchmark's own group with ``--steps`` and ``--warmup``. Here
    ``--warmup`` counts iterations left out of the timing, as in tf_cnn_benchmarks, so it
    replaces the training flag of that name (the learning-rate warmup, of no use to one
    timed epoch)."""
    p = build_parser(prog, description=doc.split("\n\n")[0])
    p.set_defaults(**DEFAULTS)
    own = p.add_argument_group("this benchmark", conflict_handler="resolve")
    own.add_argument("--steps", metavar="ITERATIONS", type=int, default=steps,
                     help=f"iterations per measurement, warm-up included (default: {steps})")
    own.add_argument("--warmup", dest="warmup_iters", metavar="ITERATIONS", type=int, default=warmup,
                     help=f"iterations excluded from the timing (default: {warmup})")
    return p, own


def parse(p, argv: list[str] | None):
    """``argv`` parsed; a usage error when nothing would be timed."""
    args = p.parse_args(argv)
    if args.steps <= args.warmup_iters:
        p.error(f"--steps {args.steps} must exceed --warmup {args.warmup_iters}")
    return args


def synthetic_mode(args) -> str:
    """The synthetic data the benchmark runs on: ``--data synthetic-resident``, else the
    loader-fed ``synthetic-loader`` (the default; a dataset directory is not timed here)."""
    from guide_utils.data.loaders import SYNTHETIC_MODES

    return SYNTHETIC_MODES.get(getattr(args, "data", None) or "synthetic", "synthetic-loader")


def timed_config(args, *, per_worker_batch: int | None = None, workers: int = 1, **settings):
    """The TrainConfig of one measurement: the flags given, then one epoch of ``--steps``
    iterations on just enough synthetic images (``--data synthetic-loader`` or
    ``synthetic-resident``) for ``workers`` workers, timed after ``--warmup``, no progress
    bar; ``settings`` last."""
    batch = per_worker_batch or args.per_worker_batch
    return to_config({**vars(args), "data": synthetic_mode(args), "epochs": 1, "per_worker_batch": batch,
                      "synthetic_size": batch * (args.steps + 1) * workers, "max_steps_per_epoch": args.steps,
                      "throughput_warmup_iters": args.warmup_iters, "progress": False, **settings})
