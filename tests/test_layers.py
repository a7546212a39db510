"""The layers of src/guide_utils hold: each imports only from the layers below it
(pyproject.toml's import-linter contract), CONTRIBUTING.md draws the same layers, and a
back arrow really fails the check."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _contract() -> dict:
    (contract,) = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return contract


def _lint(src: Path, config: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--no-cache"], cwd=config.parent,
                          env=env, capture_output=True, text=True, timeout=300)


def test_every_module_imports_only_from_the_layers_below():
    proc = _lint(REPO / "src", REPO / "pyproject.toml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 kept, 0 broken" in proc.stdout


def test_the_contract_has_its_layers_and_no_exceptions():
    contract = _contract()
    assert contract["type"] == "layers" and len(contract["layers"]) >= 5
    assert "ignore_imports" not in contract, "an ignored import needs its reason in a comment, or a fix"
    packages = {p.name for p in (REPO / "src" / "guide_utils").iterdir()
                if p.is_dir() and (p / "__init__.py").exists()}
    named = {m.strip().removeprefix("guide_utils.") for layer in contract["layers"] for m in layer.split("|")}
    assert packages <= named, f"packages in no layer: {sorted(packages - named)}"


def test_contributing_draws_the_contract():
    """The map a newcomer reads first names the same layers, in the same order."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    assert re.findall(r"^## (.+)$", text, re.M)[0].startswith("The map"), "the map is the first section"
    diagram = text.split("```text\n", 1)[1].split("```", 1)[0]
    # a layer's line: its name, then its modules ("cluster | perf"), then what it holds
    drawn = [re.split(r"\s{2,}", line.strip())[1] for line in diagram.splitlines()
             if line.strip() and not line.strip().startswith("↓") and not line.startswith("   ")]
    layers = [" | ".join(m.strip().removeprefix("guide_utils.") for m in layer.split("|"))
              for layer in _contract()["layers"]]
    assert drawn == layers


def test_a_back_arrow_fails(tmp_path):
    """The engine importing a study (a floor leaning on an upper storey) breaks the contract."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "src" / "guide_utils", src / "guide_utils", ignore=shutil.ignore_patterns("recorded"))
    with open(src / "guide_utils" / "engine" / "metrics.py", "a") as f:
        f.write("\nfrom ..studies import sweep  # noqa: E402,F401\n")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    proc = _lint(src, tmp_path / "pyproject.toml")
    assert proc.returncode != 0 and "guide_utils.engine.metrics -> guide_utils.studies.sweep" in proc.stdout, \
        proc.stdout[-3000:]
