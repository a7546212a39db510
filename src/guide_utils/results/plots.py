"""The guide's figures, drawn the same way in every notebook: the reader's runs beside the thesis's.

Every function takes a matplotlib ``Axes`` (or makes one) and tables from ``records``,
``seeds`` or ``sweep``; none runs anything. ``hardware_label()`` is what figures say they
were measured on: numbers from this laptop say nothing about a GPU cluster.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

METHOD_STYLE = {"baseline": ("k", "--"), "naive": ("tab:red", "o-"), "linear": ("tab:orange", "s-"),
                "linear+warmup": ("tab:green", "^-"), "sqrt+warmup": ("tab:purple", "v-"),
                "lars+warmup": ("tab:blue", "D-"), "lamb+warmup": ("tab:brown", "P-")}


def hardware_label() -> str:
    """CPU model, cores and GPU of this machine, for figure titles and recorded data."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {os.cpu_count()} cores, {gpu}"


def _axes(ax, figsize=(6, 3.5)):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def throughput_vs_batch(table, *, label: str, ax=None, x="per_worker_batch", y="images_per_second", **style):
    """Images/s against per-worker batch, one line (thesis experiment 1 / figure 11 style)."""
    ax = _axes(ax)
    rows = table.sort_values(x)
    ax.plot(rows[x], rows[y], style.pop("fmt", "o-"), label=label, **style)
    ax.set_xlabel("per-worker batch")
    ax.set_ylabel("images/s")
    ax.set_xticks(sorted(rows[x].unique()))
    ax.set_ylim(bottom=0)  # ratios, not offsets: a cut axis would exaggerate small differences
    return ax


def scaling_panels(curves: dict, *, axes=None, ideal_up_to: int | None = None):
    """Speedup and scaling efficiency against workers (thesis figures 14-17).

    ``curves`` maps a label to a table with ``gpus`` and ``images_per_second`` that includes
    its own 1-worker row: every curve is measured against its own baseline.
    """
    import matplotlib.pyplot as plt

    from ..core.scaling import efficiency, speedup

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    top = 1
    for label, table in curves.items():
        rows = table.sort_values("gpus")
        base = rows.loc[rows["gpus"] == 1, "images_per_second"]
        if base.empty:
            raise ValueError(f"{label}: no 1-worker row to measure speedup against")
        b = float(base.iloc[0])
        s = [speedup(t, b) for t in rows["images_per_second"]]
        e = [100 * efficiency(t, b, int(g)) for t, g in zip(rows["images_per_second"], rows["gpus"])]
        axes[0].plot(rows["gpus"], s, "o-", label=label)
        axes[1].plot(rows["gpus"], e, "o-", label=label)
        top = max(top, int(rows["gpus"].max()))
    top = ideal_up_to or top
    axes[0].plot([1, top], [1, top], ":", color="grey", label="ideal")
    axes[1].axhline(100, ls=":", color="grey")
    axes[0].set(xlabel="workers (GPUs)", ylabel="speedup over 1 worker")
    axes[1].set(xlabel="workers (GPUs)", ylabel="scaling efficiency (%)", ylim=(0, 110))
    axes[0].legend(fontsize=8)
    return axes


def quality_vs_k(outcomes, *, table=None, ax=None, metric="best_val_top1_err",
                 metric_label="best top-1 validation error (%)"):
    """Error against the scaling factor k per method: the median of the runs, with a bar from
    the best to the worst run (a mean and standard deviation would hide a diverged run).

    ``outcomes`` comes from a study's ``outcomes`` (columns k, method, median, best, worst);
    its k = 1 ``baseline`` row becomes a band from its best to its worst run. With ``table``
    (the study's runs) every run is drawn too. The error axis is logarithmic, so a diverged
    run does not flatten the differences that matter.
    """
    ax = _axes(ax, figsize=(6.5, 4))
    ax.set_yscale("log", nonpositive="clip")
    base = outcomes[outcomes["method"] == "baseline"]
    if not base.empty:
        m = float(base["median"].iloc[0])
        ax.axhspan(float(base["best"].iloc[0]), float(base["worst"].iloc[0]), color="grey", alpha=0.2)
        ax.axhline(m, color="k", ls="--", label=f"baseline k=1 (median {m:.2f}%)")
    for method, rows in outcomes[outcomes["method"] != "baseline"].groupby("method", sort=False):
        color, fmt = METHOD_STYLE.get(method, (None, "o-"))
        rows = rows.sort_values("k")
        spread = [rows["median"] - rows["best"], rows["worst"] - rows["median"]]
        ax.errorbar(rows["k"], rows["median"], yerr=spread, fmt=fmt, color=color, capsize=3, label=method)
        if table is not None:
            runs = table[table["method"] == method]
            ax.scatter(runs["k"], runs[metric], color=color, alpha=0.35, s=12)
    ax.set_xscale("log", base=2)
    ks = sorted(outcomes["k"].unique())
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("scaling factor k (global batch = k x base batch)")
    ax.set_ylabel(metric_label + ": median, best to worst run")
    ax.legend(fontsize=8)
    return ax


def lr_schedules(schedules: dict, *, epochs: int, steps_per_epoch: int = 20, ax=None):
    """Learning rate against (fractional) epoch for each named ``lr_at`` schedule."""
    from ..core.schedules import lr_at

    ax = _axes(ax, figsize=(7, 3.5))
    xs = [i / steps_per_epoch for i in range(epochs * steps_per_epoch)]
    for label, schedule in schedules.items():
        ax.plot(xs, [lr_at(x, **schedule) for x in xs], label=label)
    ax.set(xlabel="epoch", ylabel="learning rate")
    ax.legend(fontsize=8)
    return ax


def error_curves(runs: dict, *, column: str = "val_top1_err", ax=None):
    """Per-epoch curves of several run records (the thesis's figures 18-26)."""
    ax = _axes(ax)
    for label, run in runs.items():
        ax.plot(run.epochs["epoch"], run.epochs[column], label=label)
    ax.set(xlabel="epoch", ylabel=column.replace("_", " ") + " (%)")
    ax.legend(fontsize=8)
    return ax


def batch_axis(ax, batches, *, ylabel: str = "best top-1 validation error (%)"):
    """A log2 global-batch axis ticked at exactly the batches that were run."""
    batches = sorted(int(b) for b in set(batches))
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set(xlabel="global batch", ylabel=ylabel)
    return ax


def utilisation(run, *, axes=None):
    """Utilisation over time from a record made with ``--monitor`` (the thesis's figures 22,
    23 and 27): left, every GPU's utilisation (or, without GPUs, every CPU core's); right,
    the node's CPUs and the training process with its loader workers."""
    import matplotlib.pyplot as plt

    samples = getattr(run, "samples", None)
    if samples is None or samples.empty:
        raise ValueError(f"{run.name} has no utilisation samples: train with --monitor")
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    t = samples["t"]
    if "gpus" in samples and samples["gpus"].notna().any():
        for i in range(max(len(g) for g in samples["gpus"].dropna())):
            axes[0].plot(t, [g[i]["util_percent"] if isinstance(g, list) and len(g) > i else None
                             for g in samples["gpus"]], label=f"GPU {i}")
        axes[0].set(ylabel="GPU utilisation (%)")
    else:
        cores = samples["cpu_percent_per_core"].tolist()
        for i in range(len(cores[0])):
            axes[0].plot(t, [c[i] for c in cores], label=f"core {i}")
        axes[0].set(ylabel="CPU core utilisation (%)")
    axes[1].plot(t, samples["cpu_percent"], label="node CPUs (mean of cores)")
    axes[1].plot(t, samples["process_cpu_percent"], label="training process + loaders (% of one core)")
    axes[1].set(ylabel="CPU (%)")
    for ax in axes:
        ax.set(xlabel="seconds since the start", ylim=(0, None))
        ax.legend(fontsize=7)
    return axes


def comms_sweep(table, *, axes=None, label_suffix: str = ""):
    """Allreduce time and bus bandwidth against message size, one line per runtime (and
    compression), from ``guide_utils.perf.comms.table(rows)``."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    sweep = table[table["kind"] == "allreduce"]
    for (runtime, compression), rows in sweep.groupby(["runtime", "compression"], sort=False):
        label = runtime + ("" if compression == "none" else f" ({compression})") + label_suffix
        rows = rows.sort_values("bytes")
        axes[0].plot(rows["bytes"], rows["time_s"] * 1e6, "o-", ms=3, label=label)
        axes[1].plot(rows["bytes"], rows["busbw_GBps"], "o-", ms=3, label=label)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("time per allreduce (us)")
    axes[1].set_ylabel("bus bandwidth (GB/s)")
    axes[1].set_ylim(bottom=0)
    axes[0].legend(fontsize=7)
    return axes


def efficiency_vs_workers(curves: dict, *, ax=None, published=None):
    """Predicted scaling efficiency against workers, one line per label; ``published``: a
    table with ``workers``, ``efficiency`` and ``source`` drawn as labelled points."""
    ax = _axes(ax, figsize=(6.5, 3.8))
    for label, table in curves.items():
        ax.plot(table["workers"], 100 * table["efficiency"], "-", label=label)
    if published is not None:
        for source, rows in published.groupby("source", sort=False):
            ax.plot(rows["workers"], 100 * rows["efficiency"], "o", label=source)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="workers (GPUs)", ylabel="scaling efficiency (%)", ylim=(0, 105))
    ax.axhline(100, ls=":", color="grey")
    ax.legend(fontsize=7)
    return ax


def ratio_bars(labels, ratios, *, ax=None, reference: float = 1.0, xlabel: str = "ratio", colors=None):
    """Horizontal bars of ratios (a step against the one before, a setup against its limit),
    with a line at ``reference``."""
    ax = _axes(ax, figsize=(7, 0.35 * len(labels) + 1))
    ypos = list(range(len(labels)))[::-1]
    ax.barh(ypos, ratios, color=colors)
    ax.set_yticks(ypos, labels)
    ax.axvline(reference, color="k", ls=":")
    for y, r in zip(ypos, ratios):
        ax.text(r, y, f" {r:.2f}", va="center", fontsize=8)
    ax.set(xlabel=xlabel, xlim=(0, max(max(ratios) * 1.15, reference * 1.1)))
    return ax
