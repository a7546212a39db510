"""Rank 0's output in the notebook while the engines train: its ``[train]`` lines, a progress
bar over the epochs and, live, a figure of its run record redrawn after every epoch.
"""

from __future__ import annotations

import re
import sys
import textwrap
import time
from pathlib import Path

from ..core.config import TrainConfig

EPOCH_LINE = re.compile(r"^\[train\] epoch (\d+)/(\d+)")
RECORD = re.compile(r"; record (\S+\.jsonl)$")


class Follower:
    """Rank 0's output as it arrives: its [train] lines, a progress bar over the epochs, and
    (``live``, in a notebook) a figure of its run record redrawn after every epoch. In a
    notebook the bar is one display updated in place (a text bar would add a line per
    refresh); elsewhere it is tqdm's."""

    def __init__(self, cfg: TrainConfig, n: int, live: bool, progress: bool):
        from tqdm import tqdm

        self.seen, self.record, self.done, self.total = 0, None, 0, cfg.epochs
        self.desc, self.start, self.meter, self.bar = f"{cfg.dist} on {n} engines", time.monotonic(), None, None
        if progress and live:
            from IPython.display import display

            self.meter = display({"text/plain": self._meter_text()}, raw=True, display_id=True)
        elif progress:
            self.bar = tqdm(total=cfg.epochs, desc=self.desc, unit="epoch", file=sys.stdout, ncols=80, mininterval=0)
        self.plot = _LivePlot(f"{cfg.model} on {cfg.data}, {cfg.dist} x {n} (live)") if live else None

    def _meter_text(self) -> str:
        from tqdm import tqdm

        return tqdm.format_meter(self.done, self.total, time.monotonic() - self.start, ncols=80, prefix=self.desc,
                                 unit="epoch")

    def feed(self, text: str) -> None:
        cut = text.rfind("\n") + 1
        for line in text[self.seen:cut].splitlines():
            if not line.startswith("[train]"):
                continue  # only the engine's own compact lines: Jupyter limits output rates
            # The record by its name (its folder is the notebook's results directory), wrapped
            # to the width of a notebook's (and the book's) output column.
            record = RECORD.search(line)
            brief = line.replace(record.group(1), Path(record.group(1)).name) if record else line
            shown = "\n".join(textwrap.wrap(brief, 96, subsequent_indent="    ", break_long_words=False,
                                             break_on_hyphens=False)) or brief
            self.bar.write(shown, file=sys.stdout) if self.bar else print(shown, flush=True)
            if match := RECORD.search(line):
                self.record = match.group(1)
            if match := EPOCH_LINE.match(line):
                self._advance(int(match.group(1)))
        self.seen = max(self.seen, cut)

    def _advance(self, epoch: int) -> None:
        if self.bar:
            self.bar.update(epoch - self.bar.n)
        self.done = epoch
        if self.meter:
            self.meter.update({"text/plain": self._meter_text()}, raw=True)
        if self.plot and self.record:
            self.plot.update(self.record)

    def close(self) -> None:
        if self.bar:
            self.bar.close()


class _LivePlot:
    """The run record's training and validation error, one display redrawn in place."""

    def __init__(self, title: str):
        import matplotlib.pyplot as plt
        from IPython.display import display

        self.fig, self.ax = plt.subplots(figsize=(6, 3.2))
        self.title = title
        self.handle = display(self.fig, display_id=True)
        plt.close(self.fig)  # shown through the handle only

    def update(self, record: str) -> None:
        from ..core.records import read_run

        epochs = read_run(record).epochs
        self.ax.clear()
        self.ax.plot(epochs["epoch"], epochs["train_top1_err"], "s--", label="training")
        self.ax.plot(epochs["epoch"], epochs["val_top1_err"], "o-", label="validation")
        self.ax.set(xlabel="epoch", ylabel="top-1 error (%)", title=self.title)
        self.ax.title.set_fontsize(9)
        self.ax.legend(fontsize=8)
        self.handle.update(self.fig)


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (where the bar and the figure are displays)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")

