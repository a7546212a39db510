"""Rank 0's output in the notebook while the engines train: its ``[train]`` lines, a progress
bar over the epochs and, live, a figure of its run record redrawn after every epoch; the
watch's word when the run stops getting anywhere (``watch``); the engines' results.
"""

from __future__ import annotations

import re
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...core.config import TrainConfig
from ...core.errors import GuideError

EPOCH_LINE = re.compile(r"^\[train\] epoch (\d+)/(\d+)")
EPOCH_SECONDS = re.compile(r"\s(\d+(?:\.\d+)?) s$")  # an epoch line's last word: the epoch's seconds
RECORD = re.compile(r"; record (\S+\.jsonl)$")
# Seconds to wait, after the engines' results, for their last printed lines (another channel).
OUTPUT_WAIT = 30.0


class Follower:
    """Rank 0's output as it arrives: its [train] lines, a progress bar over the epochs, and
    (``live``, in a notebook) a figure of its run record redrawn after every epoch. In a
    notebook the bar is one display updated in place (a text bar would add a line per
    refresh); elsewhere it is tqdm's."""

    def __init__(self, cfg: TrainConfig, n: int, live: bool, progress: bool):
        from tqdm import tqdm

        self.seen, self.record, self.done, self.total = 0, None, 0, cfg.epochs
        self.began: float | None = None  # when rank 0's first line came: its set-up is done
        self.first_seconds: float | None = None  # the first epoch's, as rank 0 timed it
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
            self.began = self.began or time.monotonic()
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
                seconds = EPOCH_SECONDS.search(line)
                if self.first_seconds is None and seconds:
                    self.first_seconds = float(seconds.group(1))
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
        from ...core.records import read_run

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



class QueueLine:
    """The engines' job while it waits in the queue, one status line: its state, Slurm's
    reason, the scheduler's expected start, how long it has waited and how long it may. In a
    notebook one display updated in place; elsewhere a line printed when the state or the
    reason changes."""

    def __init__(self, job_id: str, limit: float | None, live: bool):
        self.job_id, self.limit, self.live, self.start = job_id, limit, live, time.monotonic()
        self.shown: tuple[str, str] | None = None
        self.handle = None

    def text(self, state: str, reason: str, expected: str) -> str:
        waited = time.monotonic() - self.start
        if state == "RUNNING":
            return f"engines: Slurm job {self.job_id} RUNNING after {_clock(waited)} in the queue; its engines register"
        why = f" ({reason})" if reason and reason != "None" else ""
        when = f", expected start {expected}" if expected not in ("", "N/A", "Unknown") else ""
        limit = (f"gives up after {_clock(self.limit)} (queue_timeout={self.limit:g})" if self.limit is not None
                 else "no limit (queue_timeout=None): interrupt to cancel the job")
        return f"engines: Slurm job {self.job_id} {state}{why}{when}; waited {_clock(waited)}, {limit}"

    def update(self, state: str, reason: str, expected: str) -> None:
        line = self.text(state, reason, expected)
        if self.live:
            from IPython.display import display

            if self.handle is None:
                self.handle = display({"text/plain": line}, raw=True, display_id=True)
            else:
                self.handle.update({"text/plain": line}, raw=True)
        elif self.shown != (state, reason):
            print(line, flush=True)
        self.shown = (state, reason)


def _clock(seconds: float) -> str:
    """m:ss, or h:mm:ss from an hour on.

    >>> _clock(75), _clock(3725)
    ('1:15', '1:02:05')
    """
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def follow(ar, follower, watch, client, stop) -> None:
    """Feed rank 0's printed lines to ``follower`` until the run ends and its last line is in;
    ``watch`` (a ``watch.Watch``) names what is wrong when the run stops getting anywhere: then
    ``stop()`` and one line.

    An engine's result and its printed lines travel on different channels, so the result can
    come first: its last lines (the last epoch's) are waited for, not read at once."""
    while not ar.ready():
        ar.wait(0.5)
        follower.feed(ar.stdout[0])
        watch.epoch(follower.done, follower.began, follower.first_seconds)
        problem = watch.check(client, ar, follower.total)
        if problem:
            stop()
            raise GuideError(problem)
    problem = watch.dead(ar)
    if problem:
        stop()
        raise GuideError(problem)
    ar.wait_for_output(OUTPUT_WAIT)
    follower.feed(ar.stdout[0] + "\n")


def results(ar) -> list:
    """The engines' return values; a GuideError raised on an engine becomes this one line."""
    from ipyparallel.error import CompositeError, RemoteError

    try:
        return list(ar.get())
    except (CompositeError, RemoteError) as exc:
        errors = getattr(exc, "elist", None) or [(getattr(exc, "ename", ""), getattr(exc, "evalue", ""))]
        for ename, evalue, *_ in errors:
            if ename == "GuideError":
                raise GuideError(f"on the engines: {evalue}") from None
        raise


@dataclass
class InteractiveResult:
    """One training on the engines: every rank's result, rank 0 first."""

    dist: str
    results: list = field(default_factory=list)  # engine.loop.RunResult per rank

    @property
    def workers(self) -> int:
        return len(self.results)

    @property
    def record_path(self) -> Path:
        return Path(self.results[0].record_path)

    @property
    def digests(self) -> list[str]:
        return [r.weights_digest for r in self.results]

    @property
    def run(self):
        from ...core.records import read_run

        return read_run(self.record_path)
