"""Two workers on one 2-core machine: where the third of the machine goes, and how to get it back.

The study behind chapter 10's last section and ``benchmarks/two_worker_scaling.py``. Every
setup trains ResNet-18 on synthetic 64 px images with one thread per worker through the
guide's engine. A setup that trains together is compared with its *limit*: the same number
of workers at the same per-worker batch started at the same moment without communicating,
which is what the two cores (and their shared memory bandwidth) can compute at all.

:data:`RECOMMENDED` is the configuration the guide recommends for two workers on a machine
like this one; :func:`recorded` returns the measurement the book shows.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import record
from .runs import Setup, side_by_side

STEPS = 40
BASE = ["--profile", "full", "--model", "resnet18", "--data", "synthetic", "--image-size", "64", "--epochs", "1",
        "--loader-workers", "0"]


def _batch(b: int) -> tuple[str, ...]:
    return ("--per-worker-batch", str(b))


MPI_YIELD = (("OMPI_MCA_mpi_yield_when_idle", "1"),)
SETUPS = {s.name: s for s in (
    Setup("alone-16", 1, "alone", _batch(16), note="one worker, the machine to itself"),
    Setup("independent-16", 2, "independent", _batch(16), note="the limit: no communication"),
    Setup("horovod-gloo", 2, "horovodrun", _batch(16), note="Horovod defaults (128 MiB, 1 ms), Gloo"),
    Setup("horovod-mpi", 2, "mpirun", _batch(16), note="Horovod defaults, OpenMPI (shared memory)"),
    Setup("ddp", 2, "torchrun", _batch(16), note="DDP defaults (25 MB buckets), Gloo"),
    Setup("horovod-gloo-fp16", 2, "horovodrun", (*_batch(16), "--fp16-allreduce")),
    Setup("ddp-fp16", 2, "torchrun", (*_batch(16), "--fp16-allreduce"), note="fp16_compress_hook"),
    Setup("horovod-gloo-cycle10", 2, "horovodrun", (*_batch(16), "--cycle-time-ms", "10")),
    Setup("horovod-gloo-fusion0", 2, "horovodrun", (*_batch(16), "--fusion-threshold-mb", "0")),
    Setup("horovod-mpi-yield", 2, "mpirun", _batch(16), MPI_YIELD, note="waiting MPI ranks yield the core"),
    Setup("ddp-bucket100", 2, "torchrun", (*_batch(16), "--ddp-bucket-mb", "100"), note="one bucket"),
    Setup("ddp-bucket5", 2, "torchrun", (*_batch(16), "--ddp-bucket-mb", "5")),
    Setup("independent-32", 2, "independent", _batch(32), note="the limit at 32 per worker"),
    Setup("ddp-32", 2, "torchrun", _batch(32)),
    Setup("horovod-mpi-32", 2, "mpirun", _batch(32)),
    Setup("independent-64", 2, "independent", _batch(64), note="the limit at 64 per worker"),
    Setup("ddp-64", 2, "torchrun", _batch(64)),
    Setup("horovod-gloo-64", 2, "horovodrun", _batch(64)),
    Setup("horovod-mpi-64", 2, "mpirun", _batch(64)),
)}
DEFAULTS = ("horovod-gloo", "horovod-mpi", "ddp")
RECOMMENDED = "ddp-64"


def limit_of(name: str) -> str:
    """The no-communication limit a setup is measured against: same per-worker batch."""
    flags = SETUPS[name].flags
    batch = flags[flags.index("--per-worker-batch") + 1]
    return f"independent-{batch}"


def choose(names: list[str]) -> list[str]:
    """Setup names from the benchmark's ``--setups``, with the limits they need."""
    if names == ["all"]:
        picked = list(SETUPS)
    elif names == ["default"]:
        picked = ["alone-16", *DEFAULTS, RECOMMENDED]
    else:
        unknown = [n for n in names if n not in SETUPS]
        if unknown:
            raise SystemExit(f"unknown setup(s) {', '.join(unknown)}; see --list")
        picked = list(names)
    for n in list(picked):
        if limit_of(n) not in picked:
            picked.append(limit_of(n))
    return list(dict.fromkeys(picked))


def _steps_for(name: str, steps: int) -> list[str]:
    flags = SETUPS[name].flags
    batch = int(flags[flags.index("--per-worker-batch") + 1])
    n = max(20, steps * 16 // batch)  # the same images per run, at least 20 steps (10 of them warm-up)
    return ["--max-steps-per-epoch", str(n), "--synthetic-size", str(batch * 2 * (n + 1))]


def measure(names: list[str], *, repeats: int = 3, steps: int = STEPS, progress=None,
            asked: str = "all") -> dict[str, Any]:
    """Every named setup ``repeats`` times side by side; each with its ratio to its limit."""
    loads = [os.getloadavg()[0]]
    measured = {}
    by_batch: dict[tuple[str, ...], list[str]] = {}
    for n in names:  # one side-by-side group per step count, so runs of a group are alike
        by_batch.setdefault(tuple(_steps_for(n, steps)), []).append(n)
    for extra, group in by_batch.items():
        measured.update(side_by_side([SETUPS[n] for n in group], [*BASE, *extra], repeats=repeats,
                                     progress=progress))
        loads.append(os.getloadavg()[0])
    rows = []
    for name, m in measured.items():
        lim = measured[limit_of(name)]
        paired = sorted(a / b for a, b in zip(m.rates, lim.rates))
        rows.append({"setup": name, "how": m.setup.describe(), "note": m.setup.note,
                     "images_per_second": m.median, "runs": [round(r, 1) for r in m.rates],
                     "limit": limit_of(name), "ratio_to_limit": paired[len(paired) // 2]})
    meta = record.provenance(study="two_worker_scaling", repeats=repeats, steps=steps,
                             regenerate=f"python benchmarks/two_worker_scaling.py --setups {asked} --repeats {repeats} "
                                        "--record src/guide_utils/results/recorded/two_workers.jsonl")
    meta["load_avg_1min"] = [round(x, 2) for x in loads]
    return {"meta": meta, "rows": rows}


def format_result(result: dict[str, Any]) -> str:
    lines = [f"{'setup':<22} {'img/s':>8} {'of limit':>9}  runs / how"]
    for r in result["rows"]:
        lines.append(f"{r['setup']:<22} {r['images_per_second']:8.1f} {r['ratio_to_limit']:9.3f}  "
                     f"{r['runs']}  {r['how']}")
    m = result["meta"]
    lines.append(f"{m['hardware']}; load {m['load_avg_1min']}; {m['repeats']} rounds; commit {m['commit']}")
    return "\n".join(lines)


def write_record(result: dict[str, Any], path: str | Path) -> None:
    """The first line is the provenance; then one JSON line per setup."""
    record.write(path, result["meta"], ({"kind": "setup", **r} for r in result["rows"]))


def recorded(name: str = "two_workers.jsonl") -> dict[str, Any]:
    """The study as recorded on the guide's CI machine: ``{"meta": ..., "rows": [...]}``."""
    meta, rows = record.read(name)
    return {"meta": meta, "rows": [x for x in rows if x.get("kind") == "setup"]}


def table(result: dict[str, Any]):
    """The setups as a DataFrame, with the limit's images/s beside each."""
    import pandas as pd

    t = pd.DataFrame(result["rows"])
    rate = dict(zip(t["setup"], t["images_per_second"]))
    return t.assign(limit_images_per_second=t["limit"].map(rate))


# Which comms runtime carries each setup's gradients.
RUNTIME_OF = {"horovod-gloo": "horovod-gloo", "horovod-mpi": "horovod-mpi", "ddp": "torch-gloo"}
MODEL = "resnet18"


def predicted_vs_measured(comms_rows: list[dict[str, Any]], result: dict[str, Any], *, batch: int = 16):
    """The step model calibrated on this machine (the comms sweep for the network, the two
    independent workers for the compute) against the measured two-worker runs.

    One row per default setup: its runtime, the calibrated bus bandwidth and latency, the
    predicted and measured images/s, and both as a ratio to the two-independent-workers limit.
    """
    import pandas as pd

    from .model import PARAMETERS, Workload, calibrate_network, predict

    rate = {r["setup"]: r["images_per_second"] for r in result["rows"]}
    limit = rate[f"independent-{batch}"]
    work = Workload(PARAMETERS[MODEL], batch, limit / 2)  # one worker's compute while both cores compute
    rows = []
    for setup, runtime in RUNTIME_OF.items():
        if setup not in rate:
            continue
        net = calibrate_network(comms_rows, runtime, size_bytes=work.gradient_bytes)
        p = predict(work, net, 2)
        rows.append({"setup": setup, "runtime": runtime, "busbw_GBps": net.bandwidth / 1e9,
                     "latency_us": net.latency * 1e6, "compute_ms": p.compute_s * 1e3,
                     "allreduce_ms": p.allreduce_s * 1e3, "predicted_images_per_second": p.images_per_second,
                     "measured_images_per_second": rate[setup], "predicted_ratio": p.efficiency,
                     "measured_ratio": rate[setup] / limit})
    return pd.DataFrame(rows)
