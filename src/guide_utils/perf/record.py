"""Recorded measurements: what took minutes to measure, kept in ``results/recorded/`` with
where, when and with what it ran in the first line, and the command that measures it again.

Each file is JSON lines; the first line is a ``provenance`` object (date, host, hardware,
load average before and after, commit, Python, PyTorch and Horovod versions, the command).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from ..core.paths import packaged
from ..results import provenance as _provenance


def provenance(**extra: Any) -> dict[str, Any]:
    """Date, machine, current load, commit and versions, plus ``extra`` (``results.provenance``,
    which builds the study CSVs' first line too)."""
    return _provenance.record(**extra)


def write(path: str | Path, first: dict[str, Any], rows: Iterable[dict[str, Any]]) -> Path:
    """``first`` (the provenance) then every row, one JSON object per line; replaces ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(first) + "\n")
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(tmp, path)
    return path


def read(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(provenance, rows)`` of a recorded file shipped with the package."""
    with packaged("results", "recorded", name).open(encoding="utf-8") as fh:
        lines = [json.loads(line) for line in fh if line.strip()]
    return lines[0], lines[1:]
