"""The step model's network term against emulated links: predicted vs measured efficiency.

For each link (rate, and a delay where the kernel has netem) of a two-host emulated cluster
(:mod:`.emulated`), :func:`measure` records

* the link as measured: rate and latency of one TCP connection (:mod:`.rate`);
* the guide's allreduce benchmark (``comms``: time and bus bandwidth by message size) over
  DDP's Gloo, Horovod's Gloo and Horovod's MPI;
* a short training of chapter 10's model (ResNet-18, 64 px synthetic images, 16 per worker,
  one thread per worker) with DDP, Horovod over Gloo and Horovod over MPI;

and, before each link's pairs, one worker training alone (the compute time the model takes,
measured under the load of that moment: the machine may be shared). :func:`table` puts
beside each measured efficiency (two workers' images/s over twice one worker's) the step
model's prediction (:func:`guide_utils.perf.model.predict`, no overlap) for the configured
link, for the measured link, and for the network the framework's own allreduce sweep
calibrates (:func:`~guide_utils.perf.model.calibrate_network`).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from .emulated import Cluster, Link, privileges
from .launch import RUNTIMES, SETUP, comms_sweep, train

RECORDED = "links.jsonl"
LINKS = ("100Mbit/s", "1Gbit/s", "10Gbit/s")
MODEL, BATCH = "resnet18", 16
BASE = ["--profile", "full", "--model", MODEL, "--data", "synthetic", "--image-size", "64", "--epochs", "1",
        "--loader-workers", "0", "--per-worker-batch", str(BATCH)]
ALONE_STEPS = 20  # 10 warm-up and 10 measured steps of one worker alone, before each link's pairs
REGENERATE = "python -m guide_utils links measure --record src/guide_utils/results/recorded/links.jsonl"


def steps_for(link: Link) -> int:
    """Training steps per run: the meter leaves out 10 warm-up steps; then about 8 s of
    measured steps on an idle machine (a 100 Mbit/s step takes about 4 s), 5 to 10."""
    from ..model import PARAMETERS

    step_s = PARAMETERS[MODEL] * 4 / link.rate + 0.15
    return 10 + max(5, min(10, int(8 / step_s)))


def _flags(steps: int) -> list[str]:
    return [*BASE, "--max-steps-per-epoch", str(steps), "--synthetic-size", str(BATCH * 2 * (steps + 1))]


def measure_rate(cluster: Cluster, size: int | None = None, timeout: float = 120) -> dict[str, Any]:
    """The link between hosts 0 and 1 as one TCP connection sees it (about 2 s of transfer)."""
    import json
    import sys

    from ...runtime import local
    from .emulated import PORT

    size = size or int(min(512 * 2**20, max(4 * 2**20, cluster.link.rate * 2)))
    tool = [sys.executable, "-m", "guide_utils.perf.links.rate"]
    serve = [*cluster.prefix(1), *tool, "serve", cluster.addresses[1], str(PORT + 1)]
    send = [*cluster.prefix(0), *tool, "send", cluster.addresses[1], str(PORT + 1), str(size)]
    done = local.run([serve, send], timeout=timeout, show=False)
    return json.loads(done[1].stdout.strip().splitlines()[-1])


def available() -> dict[str, str | None]:
    """Each runtime, and why it cannot run here (None: it can)."""
    from ..comms.runtimes import unavailable

    return {r: unavailable(r, 2) for r in RUNTIMES}


def measure_link(cluster: Cluster, link: Link, runtimes: list[str], *, max_bytes: str = "16M",
                 say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Everything measured on one link: its rate, the sweeps, the trainings."""
    cluster.shape(link)
    label = link.label()
    rate = measure_rate(cluster)
    say(f"{label}: measured {rate['rate_Mbit']:.0f} Mbit/s, latency {rate['latency_s'] * 1e6:.0f} us "
        f"(load {os.getloadavg()[0]:.1f})")
    rows = [{"kind": "link", "link": label, "configured_Bps": link.rate, "delay_s": link.delay,
             "measured_Bps": rate["rate_Bps"], "latency_s": rate["latency_s"], "load_avg_1min": os.getloadavg()[0]}]
    for runtime in runtimes:
        sweep = comms_sweep(cluster, runtime, max_bytes, budget=max_bytes)
        rows += [{**r, "link": label} for r in sweep]
        say(f"  {runtime}: allreduce of {sweep[-1]['bytes'] >> 20} MiB at {sweep[-1]['busbw_GBps'] * 8e3:.0f} "
            "Mbit/s busbw")
    steps = steps_for(link)
    # One worker alone, just before the pairs: on a shared machine the load drifts, and the
    # efficiency compares two workers with one worker under the same load.
    alone = train(None, None, _flags(ALONE_STEPS))
    rows.append({"kind": "alone", "link": label, "setup": "alone", "steps": ALONE_STEPS, "images_per_second": alone,
                 "load_avg_1min": os.getloadavg()[0]})
    say(f"  one worker alone: {alone:.1f} img/s")
    for runtime in runtimes:
        rate2 = train(cluster, runtime, _flags(steps))
        rows.append({"kind": "training", "link": label, "setup": SETUP[runtime], "runtime": runtime,
                     "workers": cluster.workers, "steps": steps, "images_per_second": rate2,
                     "load_avg_1min": os.getloadavg()[0]})
        say(f"  {SETUP[runtime]}: {rate2:.1f} img/s ({steps} steps)")
    return rows


def measure(links: list[Link], *, runtimes: list[str] | None = None, max_bytes: str = "16M",
            say: Callable[[str], None] = print) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The whole study: ``(provenance, rows)``."""
    from ...core.errors import GuideError
    from ..record import provenance

    reason = privileges()
    if reason:
        raise GuideError(reason)
    reasons = available()
    runtimes = runtimes or [r for r in RUNTIMES if not reasons[r]]
    for r in runtimes:
        if reasons.get(r):
            raise GuideError(f"--runtime {r}: {reasons[r]}")
    first = provenance(study="links", model=MODEL, per_worker_batch=BATCH, workers=2, runtimes=runtimes,
                       skipped={r: reasons[r] for r in RUNTIMES if r not in runtimes},
                       cores=len(os.sched_getaffinity(0)), regenerate=REGENERATE)
    loads = [os.getloadavg()[0]]
    rows: list[dict[str, Any]] = []
    with Cluster(2, links[0]) as cluster:
        for link in links:
            rows += measure_link(cluster, link, runtimes, max_bytes=max_bytes, say=say)
            loads.append(os.getloadavg()[0])
        first["pinned"] = cluster.pinned
    first["load_avg_1min"] = [round(x, 2) for x in loads]
    return first, rows


def recorded(name: str = RECORDED) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The study as recorded on the guide's CI machine: ``(provenance, rows)``."""
    from .. import record

    return record.read(name)


def table(rows: list[dict[str, Any]], alone: float | None = None):
    """One row per link and framework: configured and measured link, measured efficiency and
    the model's three predictions, with each prediction's ratio to the measurement, and the
    link rate the measured step implies (``implied_Mbit``). Each pair is set against the lone
    worker measured before its own link's runs, or against ``alone`` images/s when given."""
    import pandas as pd

    from ..model import PARAMETERS, Network, Workload, calibrate_network, predict

    links = {r["link"]: r for r in rows if r["kind"] == "link"}
    alone_of = {r["link"]: alone or r["images_per_second"] for r in rows if r["kind"] == "alone"}
    out = []
    for t in (r for r in rows if r["kind"] == "training"):
        link, alone = links[t["link"]], alone_of[t["link"]]
        work = Workload(PARAMETERS[MODEL], BATCH, alone)
        sweep = [r for r in rows if r["kind"] == "allreduce" and r["link"] == t["link"]]
        nets = {"configured": Network(link["configured_Bps"], link["delay_s"] + link["latency_s"]),
                "measured": Network(link["measured_Bps"], link["latency_s"]),
                "calibrated": calibrate_network(sweep, t["runtime"], size_bytes=work.gradient_bytes)}
        pred = {k: predict(work, net, t["workers"]) for k, net in nets.items()}
        measured = t["images_per_second"] / (t["workers"] * alone)
        # The link that would cost what the pair added to the lone worker's step (no overlap,
        # no latency): the rate the framework actually got while the workers also computed.
        n = t["workers"]
        added_s = n * BATCH / t["images_per_second"] - work.compute_s
        implied = 2 * (n - 1) / n * work.gradient_bytes / added_s if added_s > 0 else float("inf")
        out.append({"link": t["link"], "setup": t["setup"], "alone_images_per_second": alone,
                    "configured_Mbit": link["configured_Bps"] * 8e-6,
                    "measured_Mbit": link["measured_Bps"] * 8e-6, "busbw_Mbit": nets["calibrated"].bandwidth * 8e-6,
                    "implied_Mbit": implied * 8e-6,
                    "images_per_second": t["images_per_second"], "measured_eff": measured,
                    **{f"predicted_{k}": p.efficiency for k, p in pred.items()},
                    **{f"ratio_{k}": p.efficiency / measured for k, p in pred.items()}})
    return pd.DataFrame(out)


def alone_spread(rows: list[dict[str, Any]]):
    """How far one lone-worker measurement moves each run's figures. The worker alone (the
    same training on the same core) was measured once per link; :func:`table` set against
    each of those measurements in turn gives, per link and framework, the lowest and highest
    measured efficiency (``measured_eff_low``, ``_high``), prediction from the measured link,
    their ratio and the implied link rate."""
    import pandas as pd

    runs = [table(rows, alone=r["images_per_second"]) for r in rows if r["kind"] == "alone"]
    cols = ["measured_eff", "predicted_measured", "ratio_measured", "implied_Mbit"]
    spread = pd.concat(runs).groupby(["link", "setup"], sort=False)[cols].agg(["min", "max"])
    spread.columns = [f"{c}_{'low' if how == 'min' else 'high'}" for c, how in spread.columns]
    return spread.reset_index()


def small_messages(rows: list[dict[str, Any]]):
    """The smallest allreduce per link and runtime against the model's latency term
    ``2(n-1) alpha`` with the link's measured one-way latency as alpha."""
    import pandas as pd

    links = {r["link"]: r for r in rows if r["kind"] == "link"}
    small = [r for r in rows if r["kind"] == "allreduce" and r["bytes"] == 4]
    return pd.DataFrame([{"link": r["link"], "runtime": r["runtime"], "measured_us": r["time_s"] * 1e6,
                          "model_us": 2 * (r["workers"] - 1) * (links[r["link"]]["latency_s"]
                                                               + links[r["link"]]["delay_s"]) * 1e6}
                         for r in small])
