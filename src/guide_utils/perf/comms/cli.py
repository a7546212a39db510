"""``python -m guide_utils comms``: how fast can these workers average gradients?

Times an allreduce over message sizes (4 B to 256 MiB by default) for each runtime the stack
has, Horovod over Gloo and over MPI, ``torch.distributed`` over Gloo, MPI (where PyTorch was
built with it) and NCCL (GPUs), and reports what nccl-tests reports (NVIDIA/nccl-tests,
doc/PERFORMANCE.md):

* ``time_s``: seconds per allreduce, the mean of the timed iterations on each rank, then
  the slowest rank (a collective is done when its last rank is); ``cpu_s``: the CPU time
  the process spent per allreduce (all its threads, the kernel's socket work included),
  which on a machine without a network card of its own is taken from the computation;
* ``algbw`` = size / time, in GB/s (10^9 bytes per second);
* ``busbw`` = algbw x 2(n-1)/n for an allreduce: what each rank's link must carry, so that
  it can be compared with the hardware's bandwidth independently of the worker count n.

Then the knobs that decide how a training step's gradients travel, on a real model's
gradient list (ResNet-50's 161 tensors, 25.6 M parameters, by default): one allreduce per
tensor versus one fused buffer, Horovod's tensor fusion (threshold and cycle time) and fp16
compression, and DDP's bucket size (real ``DistributedDataParallel`` on a stand-in module
with the same parameter shapes and almost no arithmetic).

Run it without a launcher and it starts the workers on this machine itself (2 by default,
with ``horovodrun``, ``mpirun`` or ``torchrun``); run it under a launcher (``srun``,
``mpirun``, ``horovodrun``, ``torchrun``) and every process is one worker, as in
``slurm_examples/10_communication.sbatch``. Results are JSON lines (``--json`` or
``--out FILE``); rank 0 writes them.

>>> round(busbw(algbw(1e9, 0.5), workers=4), 3)
3.0
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from ...core.cli import ArgumentParser, one_line_errors
from ...core.errors import GuideError
from ..units import parse_bytes
from .gradients import DDP_BUCKETS_MB, METHODS, gradient_shapes, measure_gradients
from .local import run_local
from .measure import algbw, busbw, iterations, measure_sizes, sizes  # noqa: F401 - algbw, busbw: the doctest
from .results import RECORD_COMMAND, format_rows, meta, read_rows
from .runtimes import RUNTIMES, connect, unavailable

PROG = "python -m guide_utils comms"


def build_parser() -> ArgumentParser:
    import argparse

    p = ArgumentParser(prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=__doc__.split("\n\n>>>")[0].split("\n\n", 1)[1],
                       epilog="Examples:\n  python -m guide_utils comms --json                 # every runtime here, "
                              "2 workers each\n  python -m guide_utils comms --runtime horovod-mpi --knobs\n"
                              "  srun --mpi=pmix python -m guide_utils comms --runtime horovod --out comms.jsonl")
    p.add_argument("--runtime", nargs="+", metavar="NAME",
                   help=f"{', '.join(RUNTIMES)} (default: every one this machine has); under a launcher: "
                        "the one to use (horovod takes the launcher's controller)")
    p.add_argument("--workers", type=int, default=2, help="processes to start on this machine (default 2; "
                                                           "under a launcher the launcher decides)")
    p.add_argument("--experiments", nargs="+", choices=["sizes", "gradients"], default=["sizes", "gradients"],
                   help="sizes: the allreduce sweep; gradients: a model's gradient list (default: both)")
    p.add_argument("--min-bytes", default="4", help="smallest message (default 4 B)")
    p.add_argument("--max-bytes", default="256M", help="largest message (default 256M = 256 MiB)")
    p.add_argument("--factor", type=int, default=4, help="between consecutive sizes (default 4)")
    p.add_argument("--budget", default="512M", help="bytes moved per size, which sets the iterations "
                                                     "(3 to 50; default 512M)")
    p.add_argument("--fp16", action="store_true", help="the sweep once more with fp16 compression")
    p.add_argument("--model", default="resnet50", help="whose gradient list (default resnet50)")
    p.add_argument("--iters", type=int, default=3, help="timed repetitions per gradient-list method (default 3)")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS),
                   help="ways to allreduce the gradient list (default: all)")
    p.add_argument("--ddp-buckets", type=float, nargs="*", default=list(DDP_BUCKETS_MB), metavar="MB",
                   help="DDP bucket caps to try, torch runtimes (default 1 5 25 100; 25 is DDP's default)")
    p.add_argument("--knobs", action="store_true", help="also Horovod's fusion threshold x cycle time grid "
                                                        "(one launch each; local runs only)")
    p.add_argument("--fusion-threshold", help="Horovod: HOROVOD_FUSION_THRESHOLD for this run (e.g. 32M; 0: off)")
    p.add_argument("--cycle-time", type=float, help="Horovod: HOROVOD_CYCLE_TIME in ms for this run")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of tables")
    p.add_argument("--show", metavar="FILE", help="print the tables of a results file (--out) and exit")
    p.add_argument("--out", help="append the JSON lines to this file")
    p.add_argument("--record", help="write the results to this file, replacing it, with their provenance first "
                                    "(load before and after, commit, versions)")
    return p


def _check(args) -> None:
    if args.workers < 1:
        raise GuideError(f"--workers must be 1 or more, got {args.workers}")
    if args.iters < 1:
        raise GuideError(f"--iters must be 1 or more, got {args.iters}")
    if any(b <= 0 for b in args.ddp_buckets):
        raise GuideError(f"--ddp-buckets must be positive MB, got {args.ddp_buckets}")
    if args.cycle_time is not None and not 0 < args.cycle_time <= 1000:
        raise GuideError(f"--cycle-time is in milliseconds, 0 to 1000, got {args.cycle_time}")
    for name in args.runtime or ():
        if name not in RUNTIMES and name != "horovod":
            raise GuideError(f"unknown --runtime {name!r}; choose from {', '.join(RUNTIMES)}")


def _fusion_bytes(text: str) -> int:
    return 0 if str(text).strip() in ("0", "0M", "0B") else parse_bytes(text, "--fusion-threshold")


def run_worker(args, message_sizes: list[int]) -> list[dict[str, Any]]:
    """This process is one worker of a launched job: measure, and return rank 0's rows."""
    from ...runtime import launchers

    launcher = launchers.detect()
    runtime = (args.runtime or [None])[0] or ("horovod" if launcher.prefers("horovod") else
                                              "torch-nccl" if not unavailable("torch-nccl", 1, False) else "torch-gloo")
    horovod = runtime.startswith("horovod")
    if not horovod and (args.fusion_threshold is not None or args.cycle_time is not None):
        raise GuideError("--fusion-threshold and --cycle-time are Horovod's; with torch runtimes try --ddp-buckets")
    if args.fusion_threshold is not None:  # read by hvd.init()
        os.environ["HOROVOD_FUSION_THRESHOLD"] = str(_fusion_bytes(args.fusion_threshold))
    if args.cycle_time is not None:
        os.environ["HOROVOD_CYCLE_TIME"] = str(args.cycle_time)
    comm = connect(runtime)
    try:
        rows = [meta(runtime=comm.label, workers=comm.size, launcher=launcher.started_by())]
        if "sizes" in args.experiments:
            rows += measure_sizes(comm, message_sizes, budget_bytes=parse_bytes(args.budget, "--budget"))
            if args.fp16:
                rows += measure_sizes(comm, message_sizes, budget_bytes=parse_bytes(args.budget, "--budget"),
                                      fp16=True)
        if "gradients" in args.experiments:
            rows += measure_gradients(comm, gradient_shapes(args.model), model=args.model, iters=args.iters,
                                      methods=tuple(args.methods), ddp_buckets_mb=tuple(args.ddp_buckets))
    finally:
        comm.shutdown()
    return rows if comm.rank == 0 else []


def plan_lines(profile: str) -> list[str]:
    """What chapter 10 runs at ``profile`` scale, as the commands that run it."""
    if profile == "full":
        return ["the allreduce from 4 B to 256 MiB and ResNet-50's gradient list, one task per GPU, on your nodes:",
                *(f"  slurm_examples/submit.sh slurm_examples/10_communication.sbatch --nodes={n}" for n in (1, 2, 8)),
                "  RUNTIME=torch slurm_examples/submit.sh slurm_examples/10_communication.sbatch --nodes=2",
                "then compare each job's large-message busbw (comms --show FILE) with the network's bandwidth"]
    return ["on this machine, 2 workers per runtime, 4 B to 256 MiB:",
            "  python -m guide_utils comms --json",
            "recorded with:", "  " + RECORD_COMMAND.replace(" --record ", " \\\n      --record ")]


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    from ...runtime import launchers

    launched = launchers.detect() is not None  # read before a runtime's init adds variables
    args = build_parser().parse_args(argv)
    if args.show:
        print(format_rows(read_rows(args.show)))
        return 0
    _check(args)
    message_sizes = sizes(parse_bytes(args.min_bytes, "--min-bytes"), parse_bytes(args.max_bytes, "--max-bytes"),
                          args.factor)
    if args.fusion_threshold is not None:
        _fusion_bytes(args.fusion_threshold)  # a bad value fails here, before anything starts
    rows = run_worker(args, message_sizes) if launched else run_local(args, message_sizes)
    if not rows:  # not rank 0
        return 0
    if args.record:
        from ..record import write

        import shlex

        given = sys.argv[1:] if argv is None else argv
        first = {**rows[0], "kind": "provenance", "load_avg_1min_after": round(os.getloadavg()[0], 2),
                 "regenerate": " ".join([PROG, *map(shlex.quote, given)])}
        write(args.record, first, rows[1:])
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    if args.json:
        for r in rows:
            print(json.dumps(r), flush=True)
    elif not (args.out and launched):
        print(format_rows(rows), flush=True)
    return 0
