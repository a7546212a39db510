"""The comms benchmark's results: JSON rows (a provenance row first), the tables it prints,
the files it writes and the run recorded on the guide's CI machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .runtimes import MIB
from ..units import human_bytes

RECORD_COMMAND = ("python -m guide_utils comms --knobs --fp16 --record "
                  "src/guide_utils/results/recorded/comms_local.jsonl")


def meta(**fields: Any) -> dict[str, Any]:
    """When, where and with what a measurement ran: the first row of every result."""
    from ..record import provenance

    return {**provenance(**fields), "kind": "meta"}


# -- tables -------------------------------------------------------------------------------------

def table(rows: list[dict[str, Any]]):
    """The measurement rows (not meta or skipped) as a DataFrame."""
    import pandas as pd

    return pd.DataFrame([r for r in rows if r.get("kind") in ("allreduce", "gradients")])


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The sweep and the gradient-list results as two aligned text tables."""
    t = table(rows)
    out = [f"skipped {r['runtime']}: {r['reason']}" for r in rows if r.get("kind") == "skipped"]
    if t.empty:
        return "\n".join(out or ["no measurements"])
    sweep = t[t["kind"] == "allreduce"]
    if not sweep.empty:
        view = sweep.assign(size=sweep["bytes"].map(human_bytes), time_us=sweep["time_s"] * 1e6)
        cols = ["runtime", "compression", "size", "time_us", "algbw_GBps", "busbw_GBps"]
        out.append(view[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    grads = t[t["kind"] == "gradients"]
    if not grads.empty:
        view = grads.assign(time_ms=grads["time_s"] * 1e3, tensors=grads["tensors"].astype(int))
        if "fusion_threshold_bytes" in view:
            view["fusion_MiB"] = view["fusion_threshold_bytes"].map(lambda b: "" if b != b else f"{b / MIB:g}")
            view["cycle_ms"] = view["cycle_time_ms"].map(lambda c: "" if c != c else f"{c:g}")
        cols = [c for c in ("runtime", "model", "tensors", "method", "fusion_MiB", "cycle_ms", "time_ms", "busbw_GBps")
                if c in view]
        out.append(view[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return "\n\n".join(out)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows from a JSON-lines file written by this command (``--out``)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def recorded(name: str = "comms_local.jsonl") -> list[dict[str, Any]]:
    """The comms benchmark recorded on the guide's CI machine (:data:`RECORD_COMMAND`); the
    first row is its provenance."""
    from ..record import read

    first, rows = read(name)
    return [first, *rows]
