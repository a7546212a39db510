"""Read the training logs the thesis's numbers came from into records.

Two formats:

* the PyTorch-examples ImageNet script (and its Horovod port), one line per batch::

      0: Epoch: [0][199/10010]\tTime 0.582 (0.633)\tData 0.273 (0.283) ...

  optionally prefixed by a rank (``srun -l``), optionally followed by ``Loss``/``Acc@1``/
  ``Acc@5`` fields, and a validation summary `` * Acc@1 76.130 Acc@5 92.862``;
* tf_cnn_benchmarks: ``10\timages/sec: 210.3 +/- 0.5 (jitter = 1.2)\t7.856`` per step and
  ``total images/sec: 210.15`` at the end.

A line that starts like a record (contains ``Epoch: [``, ``* Acc@1`` or ``images/sec``) but
does not parse is *malformed*: it is skipped and counted. Other lines (NCCL chatter, blank
lines) are ignored. A log with no record at all is an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import GuideError
from ..core.throughput import images_per_second

_NUM = r"[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?"
_RANK = r"(?:^|\s)(?:(?P<rank>\d+):\s*)?"
_EPOCH = re.compile(
    _RANK + rf"Epoch:\s*\[(?P<epoch>\d+)\]\[\s*(?P<batch>\d+)\s*/\s*(?P<total>\d+)\]"
    rf"\s+Time\s+(?P<time>{_NUM})\s+\(\s*(?P<time_avg>{_NUM})\s*\)"
    rf"\s+Data\s+(?P<data>{_NUM})\s+\(\s*(?P<data_avg>{_NUM})\s*\)(?P<rest>.*)$")
_FIELD = re.compile(rf"(?P<name>Loss|Acc@1|Acc@5)\s+(?P<value>{_NUM})\s+\(\s*(?P<avg>{_NUM})\s*\)")
_VAL = re.compile(_RANK + rf"\*\s*Acc@1\s+(?P<acc1>{_NUM})\s+Acc@5\s+(?P<acc5>{_NUM})\s*$")
_TF_STEP = re.compile(rf"(?:^|\s)(?P<step>\d+)\s+images/sec:\s*(?P<rate>{_NUM})\s+\+/-\s+(?P<pm>{_NUM})"
                      rf"\s+\(jitter\s*=\s*(?P<jitter>{_NUM})\)(?:\s+(?P<loss>{_NUM}))?\s*$")
_TF_TOTAL = re.compile(rf"total images/sec:\s*(?P<rate>{_NUM})\s*$")
_FIELD_NAMES = {"Loss": "loss", "Acc@1": "acc1", "Acc@5": "acc5"}


class LogFormatError(GuideError, ValueError):
    """The text holds no record of the expected format (a user's file: one line, no traceback)."""


@dataclass
class LogParse:
    kind: str
    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    source: str = "<text>"


def _read(text_or_path: str | Path) -> tuple[str, str]:
    """A Path, or a one-line string naming an existing file, is read; other strings are the log."""
    s = str(text_or_path)
    looks_like_path = "\n" not in s and len(s) < 4096
    if isinstance(text_or_path, Path) or (looks_like_path and Path(s).is_file()):
        path = Path(s)
        if not path.is_file():
            raise FileNotFoundError(f"log file {path} does not exist")
        return path.read_text(errors="replace"), str(path)
    if looks_like_path and Path(s).suffix in (".log", ".txt", ".out", ".err"):
        raise FileNotFoundError(f"log file {s} does not exist")
    return s, "<text>"


def _rank(m: re.Match) -> int | None:
    return int(m.group("rank")) if m.group("rank") is not None else None


def parse_pytorch_log(text_or_path: str | Path) -> LogParse:
    """Batch lines and validation summaries of the PyTorch-examples ImageNet script."""
    text, source = _read(text_or_path)
    out = LogParse("pytorch", source=source)
    for line in text.splitlines():
        if m := _EPOCH.search(line):
            rec: dict[str, Any] = {"type": "batch", "rank": _rank(m), "epoch": int(m["epoch"]),
                                   "batch": int(m["batch"]), "batches_per_epoch": int(m["total"])}
            for key in ("time", "time_avg", "data", "data_avg"):
                rec[key] = float(m[key])
            for f in _FIELD.finditer(m["rest"]):
                name = _FIELD_NAMES[f["name"]]
                rec[name], rec[f"{name}_avg"] = float(f["value"]), float(f["avg"])
            out.records.append(rec)
        elif m := _VAL.search(line):
            out.records.append({"type": "validation", "rank": _rank(m), "acc1": float(m["acc1"]),
                                "acc5": float(m["acc5"])})
        elif "Epoch: [" in line or "* Acc@1" in line:
            out.skipped += 1
    if not out.records:
        raise LogFormatError(f"{source}: no PyTorch-examples log line found "
                             "(expected lines like 'Epoch: [0][199/10010]  Time 0.582 (0.633)  Data ...')")
    return out


def parse_tf_cnn_benchmarks_log(text_or_path: str | Path) -> LogParse:
    """Step lines and the final total of tf_cnn_benchmarks."""
    text, source = _read(text_or_path)
    out = LogParse("tf_cnn_benchmarks", source=source)
    for line in text.splitlines():
        if m := _TF_TOTAL.search(line):
            out.records.append({"type": "total", "images_per_second": float(m["rate"])})
        elif m := _TF_STEP.search(line):
            out.records.append({"type": "step", "step": int(m["step"]), "images_per_second": float(m["rate"]),
                                "plus_minus": float(m["pm"]), "jitter": float(m["jitter"]),
                                "loss": float(m["loss"]) if m["loss"] else None})
        elif "images/sec" in line:
            out.skipped += 1
    if not out.records:
        raise LogFormatError(f"{source}: no tf_cnn_benchmarks line found "
                             "(expected lines like '10  images/sec: 210.3 +/- 0.5 (jitter = 1.2)' or "
                             "'total images/sec: 210.15')")
    return out


def parse_log(text_or_path: str | Path) -> LogParse:
    """Whichever of the two formats the log is in."""
    text, source = _read(text_or_path)
    kind = parse_tf_cnn_benchmarks_log if "images/sec" in text and "Epoch: [" not in text else parse_pytorch_log
    try:
        result = kind(text)
    except LogFormatError:
        raise LogFormatError(f"{source}: neither a PyTorch-examples nor a tf_cnn_benchmarks log") from None
    result.source = source
    return result


def throughput_from_pytorch_log(parse: LogParse, per_worker_batch: int, workers: int, at_batch: int = 199,
                                epoch: int = 0) -> float:
    """The thesis's method: the running average batch time printed at ``at_batch`` of ``epoch``
    (rank 0's line when ranks are labelled), turned into images/s."""
    for rec in parse.records:
        if rec["type"] == "batch" and rec["epoch"] == epoch and rec["batch"] == at_batch and rec["rank"] in (None, 0):
            return images_per_second(per_worker_batch, workers, rec["time_avg"])
    raise LogFormatError(f"{parse.source}: no line for epoch {epoch} batch {at_batch}; "
                         "the thesis read the average time printed at batch 199")
