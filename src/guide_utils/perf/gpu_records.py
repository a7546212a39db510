"""The guide's GPU measurements: ResNet-50 on one NVIDIA H100, recorded.

* :data:`BEFORE` (``gpu_h100_2026-11-27.jsonl``): the engine at commit 22a266a, measured on
  2026-11-27 on one H100 80GB HBM3 (16 CPU cores) on a lent machine, before issue 39's changes.
  Each figure quotes the line of that session's log it was copied from.
* :data:`AFTER` (``gpu_h100_after.jsonl``, present once measured): the changed engine, what
  ``benchmarks/gpu/run_h100.sh`` prints, turned into a record by
  ``python benchmarks/gpu/record_h100.py OUT``. Chapters 1 and 12 show it when the file is
  there and say that it is not measured yet when it is not.

>>> meta, figures = before()
>>> meta["commit"], figures.loc["resident_bf16_cl_b128", "images_per_second"]
('22a266a', 3704.5)
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from ..core.paths import packaged

BEFORE = "gpu_h100_2026-11-27.jsonl"
AFTER = "gpu_h100_after.jsonl"
COMPILE_RUN = "gpu_h100_2026-11-27_resnet50_compile_run.jsonl"


def _lines(name: str) -> list[dict[str, Any]] | None:
    path = packaged("results", "recorded", name)
    if not path.is_file():
        return None
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def before():
    """``(provenance, figures)``: one row per figure, indexed by its id, with the median of
    its runs as ``images_per_second``."""
    import pandas as pd

    first, *rows = _lines(BEFORE)
    table = pd.DataFrame([{"id": r["id"], "what": r["what"], "method": r["method"], **r["config"],
                           "setting": _setting(r["config"]), "runs": r["images_per_second_runs"],
                           "images_per_second": statistics.median(r["images_per_second_runs"])} for r in rows])
    return first, table.set_index("id")


def _setting(config: dict) -> str:
    parts = [config.get("amp") if config.get("amp") not in (None, "none") else "fp32"]
    parts += ["channels_last"] * bool(config.get("channels_last")) + ["compile"] * bool(config.get("compile"))
    return ", ".join(parts)


def compile_run():
    """The engine's ``--compile --monitor 0.5`` run of that session, its run record as written."""
    from ..core.records import read_run

    return read_run(packaged("results", "recorded", COMPILE_RUN))


def after():
    """``(provenance, rows)`` of the changed engine on the GPU, or None while not measured."""
    lines = _lines(AFTER)
    return None if lines is None else (lines[0], lines[1:])


def after_table(rows: list[dict[str, Any]]):
    """The engine-against-references lines of a GPU check as a table: images/s medians and
    the ratios the targets are stated in (engine / hand loop, engine / resident batch)."""
    import pandas as pd

    out = []
    for r in rows:
        if r.get("benchmark") != "engine_vs_hand_loop":
            continue
        resident = r.get("resident_images_per_second")
        out.append({"step": r.get("step", ""), "data": r["data"], "amp": r.get("amp", "none"),
                    "input": r.get("input_dtype", ""),
                    "engine": statistics.median(r["engine_images_per_second"]),
                    "hand": statistics.median(r["hand_images_per_second"]), "engine/hand": r["ratio"],
                    "resident": statistics.median(resident) if resident else None,
                    "engine/resident": r.get("ratio_to_resident")})
    return pd.DataFrame(out)


def record_check(out: str | Path, dest: str | Path, *, commit: str, allow_smoke: bool = False) -> Path:
    """Turn the outputs of ``benchmarks/gpu/run_h100.sh`` (``env.txt``, ``results.jsonl`` in
    ``out``) into a record at ``dest``: its provenance first, then each benchmark's line."""
    from .record import write

    out = Path(out)
    env = (out / "env.txt").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()]
    if not rows:
        raise ValueError(f"{out / 'results.jsonl'} has no benchmark results")
    facts = dict(line.split(": ", 1) for line in env.splitlines() if line.startswith(("date: ", "smoke: ")))
    if facts.get("smoke") == "1" and not allow_smoke:
        raise ValueError(f"{out} holds a smoke run (GUIDE_GPU_CHECK_SMOKE=1), not a measurement")
    first = {"kind": "provenance", "study": "gpu_h100_after", "date": facts.get("date", ""),
             "smoke": facts.get("smoke") == "1", "commit": commit, "env": env.strip().splitlines(),
             "regenerate": "OUT=DIR bash benchmarks/gpu/run_h100.sh; python benchmarks/gpu/record_h100.py DIR"}
    return write(dest, first, ({"kind": "benchmark", **r} for r in rows))
