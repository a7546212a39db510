"""The guide's GPU measurements: ResNet-50 on one NVIDIA H100, recorded.

* :data:`BEFORE` (``gpu_h100_2026-11-27.jsonl``): the engine at commit 22a266a, measured on
  2026-11-27 on one H100 80GB HBM3 (16 CPU cores) on a lent machine, before issue 39's changes.
  Each figure quotes the line of that session's log it was copied from.
* the checks of the changed engine (``gpu_h100_after.jsonl``, then ``gpu_h100_after_2.jsonl``
  and so on, one per session that had a GPU): what ``benchmarks/gpu/run_h100.sh`` prints,
  turned into a record by ``python benchmarks/gpu/record_h100.py OUT``, which takes the next
  free name. :func:`afters` reads them all in the order measured, :func:`after` the latest.

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
from . import spread

BEFORE = "gpu_h100_2026-11-27.jsonl"
AFTER = "gpu_h100_after.jsonl"  # the first check; later ones are gpu_h100_after_2.jsonl, ...
COMPILE_RUN = "gpu_h100_2026-11-27_resnet50_compile_run.jsonl"
STEP_PROBE = "gpu_h100_2026-11-27_step_probe.txt"  # benchmarks/gpu/step_probe.py, before and after


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


def step_probe() -> dict[str, dict[str, Any]]:
    """The recorded ``benchmarks/gpu/step_probe.py`` output, by section (``before``,
    ``after``): ``us`` (median microseconds per step of each loop and variant), ``rounds``
    (each round's microseconds per step, the variants measured one after the other in it) and
    ``calls`` (per step, of ``hand`` and ``engine``: ATen ops, kernels, CUDA runtime calls)."""
    import ast

    text = packaged("results", "recorded", STEP_PROBE).read_text(encoding="utf-8")
    out: dict[str, dict[str, Any]] = {}
    for part in text.split("\n## ")[1:]:
        name, _, body = part.partition(":")
        section: dict[str, Any] = {"calls": {}, "rounds": []}
        for line in body.splitlines():
            if line.startswith("round ") and "{" in line:
                section["rounds"].append(ast.literal_eval(line[line.index("{"):]))
            elif line.startswith("median us/step "):
                section["us"] = ast.literal_eval(line.removeprefix("median us/step "))
            elif line.startswith("per step "):
                loop, _, counts = line.removeprefix("per step ").partition(" ")
                section["calls"][loop] = ast.literal_eval(counts)
        if "us" not in section or set(section["calls"]) != {"hand", "engine"}:
            raise ValueError(f"{STEP_PROBE}: section {name!r} lacks its timings or its per-step calls")
        out[name.strip()] = section
    return out


def _after_names() -> list[str]:
    folder = packaged("results", "recorded")
    return [p.name for p in folder.glob("gpu_h100_after*.jsonl")]


def afters() -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """``(provenance, rows)`` of every recorded check of the changed engine, oldest first."""
    checks = [(lines[0], lines[1:]) for lines in map(_lines, _after_names())]
    return sorted(checks, key=lambda check: check[0]["date"])


def after():
    """``(provenance, rows)`` of the latest check of the changed engine, or None while none is recorded."""
    checks = afters()
    return checks[-1] if checks else None


def sessions() -> list[dict[str, str]]:
    """Every recorded GPU session, oldest first: its ``date`` (day), ``commit``, the PyTorch
    that ran (``torch``) and the ``gpu``, read from each record's provenance."""
    meta, _ = before()
    out = [{"date": meta["date"], "commit": meta["commit"], "torch": meta["torch"],
            "gpu": meta["hardware"].split(",")[0]}]
    for meta, _ in afters():
        env = dict(line.split(" ", 1) for line in meta["env"] if line.startswith(("torch ", "gpu ")))
        out.append({"date": meta["date"][:10], "commit": meta["commit"][:7], "torch": env["torch"].split()[0],
                    "gpu": env["gpu"]})
    return out


def next_after_name() -> str:
    """The name a new check is recorded under: AFTER, then ``gpu_h100_after_2.jsonl``, ..."""
    taken, n = set(_after_names()), 2
    if AFTER not in taken:
        return AFTER
    while f"gpu_h100_after_{n}.jsonl" in taken:
        n += 1
    return f"gpu_h100_after_{n}.jsonl"


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


def after_spreads(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each engine-against-references line of a GPU check as its rounds measured them, by
    step: ``engine`` and ``hand`` images/s, and the round-by-round ratios ``engine/hand`` and
    ``engine/resident`` (``benchmarks/throughput.py`` alternates them: one of each per round),
    as :class:`~guide_utils.perf.spread.Spread`; the step-overhead line as ``extra_us``, the
    paired differences of the engine's and the hand loop's microseconds per step, and
    ``hand_us``."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r.get("benchmark") == "engine_vs_hand_loop":
            engine, hand, resident = (r["engine_images_per_second"], r["hand_images_per_second"],
                                      r.get("resident_images_per_second"))
            out[r["step"]] = {"engine": spread.rounds(engine), "hand": spread.rounds(hand),
                              "engine/hand": spread.paired(engine, hand),
                              "engine/resident": spread.paired(engine, resident) if resident else None}
        elif r.get("benchmark") == "step_overhead":
            out[r["step"]] = {"extra_us": spread.paired(r["engine_us_per_step"], r["hand_us_per_step"], "difference"),
                              "hand_us": spread.rounds(r["hand_us_per_step"]), "budget_us": r["budget_us"]}
    return out


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
    lines = env.strip().splitlines()
    for i, line in enumerate(lines):
        # A GPU machine may get the working tree with an older .git beside it: the commit the
        # caller names is the one that ran; what the copy's git said is kept beside it.
        seen = line.partition("commit: ")[2].strip()
        if line.startswith("commit: ") and not (seen.startswith(commit) or commit.startswith(seen)):
            lines[i] = f"commit: {commit} (the working tree sent; the copy's own .git named {seen})"
    first = {"kind": "provenance", "study": "gpu_h100_after", "date": facts.get("date", ""),
             "smoke": facts.get("smoke") == "1", "commit": commit, "env": lines,
             "regenerate": "OUT=DIR bash benchmarks/gpu/run_h100.sh; python benchmarks/gpu/record_h100.py DIR"}
    return write(dest, first, ({"kind": "benchmark", **r} for r in rows))
