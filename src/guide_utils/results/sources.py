"""The source documents' results as data: the thesis's tables 1-15 and the other seeds' headlines.

The CSV files in ``source_data/`` were extracted from the thesis text by
``scripts/extract_source_tables.py``; the first line of each names its table, section and
experiment. Tables carry the numbers of the thesis's captions (Table 10 is experiment 4); the
thesis's list of tables and its text number the quality tables 10-15 one higher. Notebooks
draw these next to the reader's own run records.

>>> thesis_table(12).query("gpus == 32")[["lr", "global_batch", "top1_acc"]].values.tolist()[0]
[1.6, 4096.0, 74.662]
>>> round(thesis_table(14).attrs["experiment"])
8
"""

from __future__ import annotations

import re

from ..core.errors import GuideError
from ..core.paths import packaged

TABLES = range(1, 16)
# Which table holds which experiment's results, by framework (thesis sections 5.1-5.9).
THROUGHPUT_TABLES = {"tensorflow": (1, 4, 7), "pytorch": (2, 5, 8), "horovod_pytorch": (3, 6, 9)}
QUALITY_TABLES = {4: 10, 5: 11, 6: 12, 7: 13, 8: 14, 9: 15}


def _read(name: str):
    import pandas as pd

    path = packaged("results", "source_data", name)
    with path.open(encoding="utf-8") as fh:
        caption = fh.readline().lstrip("# ").strip()
        table = pd.read_csv(fh)
    table.attrs["source"] = caption
    return table


def thesis_table(n: int):
    """Thesis table ``n`` (1-15) as a DataFrame; ``.attrs`` carry its caption and experiment."""
    if n not in TABLES:
        raise GuideError(f"the thesis has result tables 1 to 15, not {n}")
    table = _read(f"thesis_table_{n:02d}.csv")
    m = re.match(r"thesis Table \d+ \(section ([\d.]+), experiment (\d+)\): (.*)", table.attrs["source"])
    table.attrs.update(section=m.group(1), experiment=int(m.group(2)), caption=m.group(3))
    return table


def thesis_throughput(framework: str = "horovod_pytorch"):
    """Experiments 1-3 for one framework in one table: gpus, per_worker_batch, images_per_second."""
    import pandas as pd

    if framework not in THROUGHPUT_TABLES:
        raise GuideError(f"unknown framework {framework!r}; choose from {', '.join(THROUGHPUT_TABLES)}")
    parts = [thesis_table(n).assign(table=n) for n in THROUGHPUT_TABLES[framework]]
    return pd.concat(parts, ignore_index=True).sort_values(["per_worker_batch", "gpus"], ignore_index=True)


def thesis_quality(experiment: int):
    """The result table of quality experiment 4-9, with top-1 validation error added."""
    if experiment not in QUALITY_TABLES:
        raise GuideError(f"quality experiments are 4 to 9, not {experiment}")
    table = thesis_table(QUALITY_TABLES[experiment])
    table["top1_err"] = (100 - table["top1_acc"]).round(3)
    return table


# The first training batch of an epoch in the thesis's logs, in seconds (section 5.2, Figure 12:
# one node, 2 GPUs; section 5.3, Figure 13: 8 nodes, 32 GPUs; both at 128 images per GPU). "pytorch"
# is the PyTorch examples script (DataParallel in Figure 12, DDP across nodes in Figure 13),
# "horovod_pytorch" its Horovod version.
THESIS_FIRST_BATCH = {12: {"gpus": 2, "pytorch": 18.532, "horovod_pytorch": 9.696},
                      13: {"gpus": 32, "pytorch": 21.925, "horovod_pytorch": 9.950}}


def without_first_batch(images_per_second: float, global_batch: int, first_batch_s: float,
                        batches: int = 200) -> float:
    """Images/s over batches 2 to ``batches``, from a throughput the thesis's way.

    The thesis divides the global batch by the running-average batch time its log reports at
    batch 199 (section 5.1), so ``batches`` times that average is the time of all of them; take
    the first batch's time out and divide the rest.

    >>> round(without_first_batch(6104.32, 32 * 128, 9.95), 1)  # Table 9, Figure 13
    6560.2
    """
    total = batches * global_batch / images_per_second
    if first_batch_s >= total:
        raise GuideError(f"a first batch of {first_batch_s} s is longer than all {batches} batches ({total:.1f} s)")
    return (batches - 1) * global_batch / (total - first_batch_s)


# The quality experiments whose tables give each run's wall time, and how each trained.
# (all with the linear scaling rule)
TIMED = {5: "no warmup", 6: "stepping warmup, 5 epochs", 7: "stepping 5, 32 per GPU", 8: "gradual warmup, 5 epochs",
         9: "gradual warmup, 10 epochs"}


def time_to_accuracy(within: float = 1.0):
    """Every thesis run with a recorded wall time (experiments 5-9, all under the linear
    scaling rule; the 1-GPU baseline once),
    judged by the measure that matters: the hours to a target accuracy, here the baseline's
    top-1 less ``within`` points. The thesis gives each run's best accuracy over its 90 epochs (Tables 10-15) and
    the wall time of all of them, so ``hours_to_target`` is that wall time for a run that
    ended at or above the target (an upper bound: it may have got there earlier), and NaN
    for one that never did, however fast its images went by. One run per setting: a
    difference of a few tenths between two runs is within what another seed can give.

    >>> t = time_to_accuracy()
    >>> t.attrs["target"], t.loc[t["hours_to_target"].idxmin(), ["gpus", "wall_hours"]].tolist()
    (74.028, [32, 6.55])
    """
    import pandas as pd

    parts = [thesis_quality(exp).assign(experiment=exp, method=label) for exp, label in TIMED.items()]
    table = pd.concat(parts, ignore_index=True)
    base = table[table["baseline"]].iloc[[0]].assign(experiment=0, method="the 1-GPU baseline")
    runs = pd.concat([base, table[~table["baseline"]]], ignore_index=True)
    runs["engine"] = runs["framework"].map(lambda f: "Horovod" if "Horovod" in f else "PyTorch")
    runs["gpu_hours"] = (runs["wall_hours"] * runs["gpus"]).round(2)
    target = round(float(base["top1_acc"].iloc[0]) - within, 3)
    runs["reached"] = runs["top1_acc"] >= target
    runs["hours_to_target"] = runs["wall_hours"].where(runs["reached"])
    runs.attrs.update(target=target, baseline_top1=float(base["top1_acc"].iloc[0]), within=within)
    return runs[["experiment", "method", "engine", "gpus", "global_batch", "top1_acc", "wall_hours", "gpu_hours",
                 "reached", "hours_to_target"]]


def other_sources():
    """Headline numbers of the ARIS, Summit and SLICES documents, one row each."""
    return _read("other_sources.csv")
