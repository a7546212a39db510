"""No launcher: the comms benchmark starts its own workers on this machine.

For each runtime it runs this same command under the runtime's launcher (``horovodrun``,
``mpirun`` or ``torchrun``, ``--workers`` processes), once for the measurements and, with
``--knobs``, once per Horovod fusion setting; the workers write their rows to a file.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from ...core.errors import GuideError
from .results import meta
from .runtimes import RUNTIMES, unavailable

# Horovod's tensor-fusion settings tried by --knobs, (threshold MiB, cycle time ms); 128 MiB
# and 1 ms are Horovod's defaults (runtimes.HOROVOD_DEFAULTS).
HOROVOD_GRID = ((0, 1.0), (1, 1.0), (8, 1.0), (32, 1.0), (128, 1.0), (128, 5.0), (128, 20.0))


def launch_local(runtime: str, workers: int, worker_args: list[str], *, timeout: float = 900) -> list[dict[str, Any]]:
    """Start ``workers`` processes of this command on this machine for ``runtime``; their rows."""
    from ...runtime import launch, local

    with tempfile.TemporaryDirectory(prefix="guide-comms-") as tmp:
        out = Path(tmp) / "rows.jsonl"
        argv = launch.command(RUNTIMES[runtime].launcher, workers, "guide_utils",
                              ["comms", "--runtime", runtime, *worker_args, "--out", str(out)])
        local.run(argv, timeout=timeout, show=False)  # a failure: one line with the output's tail
        if not out.exists():
            raise GuideError(f"{runtime} with {workers} workers wrote no rows to {out}")
        return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def _worker_args(args, sizes_list) -> list[str]:
    """The command line each worker gets: the same measurements, over exactly these sizes."""
    out = ["--experiments", *args.experiments, "--min-bytes", str(sizes_list[0]) if sizes_list else "4",
           "--max-bytes", str(sizes_list[-1]) if sizes_list else "4", "--factor", str(args.factor),
           "--budget", args.budget, "--model", args.model, "--iters", str(args.iters),
           "--ddp-buckets", *map(str, args.ddp_buckets), "--methods", *args.methods]
    out += ["--fp16"] if args.fp16 else []
    out += ["--fusion-threshold", args.fusion_threshold] if args.fusion_threshold is not None else []
    return out + (["--cycle-time", str(args.cycle_time)] if args.cycle_time is not None else [])


def run_local(args, message_sizes: list[int]) -> list[dict[str, Any]]:
    """No launcher: start ``--workers`` processes per runtime on this machine."""
    names = args.runtime or list(RUNTIMES)
    if "horovod" in names:
        raise GuideError("--runtime horovod is for runs under a launcher; here name horovod-gloo or horovod-mpi")
    reasons = {name: unavailable(name, args.workers) for name in names}
    for name, reason in reasons.items():
        if reason and args.runtime:  # asked for by name: say so and stop, before anything runs
            raise GuideError(f"--runtime {name}: {reason}")
    rows: list[dict[str, Any]] = [meta(workers=args.workers, launcher="local")]
    for name in names:
        if reasons[name]:
            rows.append({"kind": "skipped", "runtime": name, "reason": reasons[name]})
            continue
        rows += [r for r in launch_local(name, args.workers, _worker_args(args, message_sizes)) if r["kind"] != "meta"]
        if args.knobs and name.startswith("horovod"):
            for threshold, cycle in HOROVOD_GRID:
                knob = argparse_copy(args, experiments=["gradients"], fusion_threshold=f"{threshold}M",
                                     cycle_time=cycle, fp16=False, methods=["async-all"])
                rows += [r for r in launch_local(name, args.workers, _worker_args(knob, message_sizes))
                         if r["kind"] == "gradients" and r["method"] == "async-all"]
    return rows


def argparse_copy(args, **changes):
    """``args`` with ``changes``: one run of the --knobs grid."""
    import argparse

    return argparse.Namespace(**{**vars(args), **changes})
