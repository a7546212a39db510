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


def _contracts() -> list[dict]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _contract() -> dict:
    """The layers contract (the others forbid single imports across them)."""
    (contract,) = [c for c in _contracts() if c["type"] == "layers"]
    return contract


def _lint(src: Path, config: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--no-cache"], cwd=config.parent,
                          env=env, capture_output=True, text=True, timeout=300)


def test_every_module_imports_only_from_the_layers_below():
    proc = _lint(REPO / "src", REPO / "pyproject.toml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"{len(_contracts())} kept, 0 broken" in proc.stdout


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


def test_the_tensorflow_door_reading_pytorch_datasets_fails(tmp_path):
    """TensorFlow's data taken from data.loaders (which imports torch: 2.5 CPU-s and 0.6 GiB in
    every TensorFlow worker) instead of data.arrays breaks its contract."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "src" / "guide_utils", src / "guide_utils", ignore=shutil.ignore_patterns("recorded"))
    data = src / "guide_utils" / "tensorflow" / "data.py"
    data.write_text(data.read_text().replace("from ..data.arrays import", "from ..data.loaders import"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    proc = _lint(src, tmp_path / "pyproject.toml")
    assert proc.returncode != 0 and "guide_utils.tensorflow.data -> guide_utils.data.loaders" in proc.stdout, \
        proc.stdout[-3000:]


# --- launcher names: only the runtime layer knows them ----------------------------------------

def _launcher_names() -> set[str]:
    from guide_utils.runtime import launch, launchers

    return {*launchers.names(), *launch.LAUNCHERS, "srun"}


def _branches_on(tree, names: set[str]) -> list[tuple[int, str]]:
    """Where ``tree`` compares with a launcher's name (``== "torchrun"``, ``in ("mpirun", ...)``,
    ``case "srun":``) or keys a dict by launcher names (a dispatch table)."""
    import ast

    def named(node) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(named(e) for e in node.elts)
        return False

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(named(n) for n in (node.left, *node.comparators)):
            found.append((node.lineno, "compares with a launcher's name"))
        elif isinstance(node, ast.Dict) and any(k is not None and named(k) for k in node.keys):
            found.append((node.lineno, "keys a dict by launcher names"))
        elif isinstance(node, ast.MatchValue) and named(node.value):
            found.append((node.lineno, "matches a launcher's name"))
    return found


def _launcher_branches(src: Path) -> list[str]:
    import ast

    names = _launcher_names()
    out = []
    for path in sorted((src / "guide_utils").rglob("*.py")):
        rel = path.relative_to(src)
        if rel.parts[1] == "runtime":
            continue
        out += [f"{rel}:{line}: {what}" for line, what in _branches_on(ast.parse(path.read_text()), names)]
    return out


def test_no_module_outside_the_runtime_layer_branches_on_a_launcher_s_name():
    """What a launcher can do is asked of its class (guide_utils.runtime.launchers): a new
    launcher is one module there, not an edit in every layer that compares names."""
    assert _launcher_branches(REPO / "src") == []


def test_the_launcher_name_check_finds_each_kind_of_branch():
    import ast

    names = _launcher_names()
    code = ('if launcher != "torchrun": pass\nx = kind in ("horovodrun", "mpirun")\n'
            'D = {"srun": 1}\nmatch kind:\n    case "jsrun": pass\n'
            'Setup("ddp", 2, "torchrun")\nok = kind == "horovod"\n')
    assert [line for line, _ in _branches_on(ast.parse(code), names)] == [1, 2, 3, 5]


# --- no import circle inside a layer -------------------------------------------------------------

def _imports(src: Path, package: str) -> dict[str, set[str]]:
    """Each module of ``package`` (under ``src``) -> the modules of ``package`` it imports,
    at the top or inside a function alike (both are an edge of the circle)."""
    import ast

    root = src / package.replace(".", "/")
    modules = {".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__"): p
               for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]  # the package it is in
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                base = f"{base}.{node.module}" if node.level and node.module else base if node.level else node.module
                # ``from . import x``: the module x where there is one, else the package
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            found |= {t for t in targets if t in modules and t != name}
        graph[name] = found
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_runtime_layer_has_no_import_circle():
    """launch -> launchers -> launch and launch -> local -> launch were circles (each closed by
    an import inside a function): a module of the runtime layer imports only modules that do
    not import it back, so each can be read, tested and moved on its own."""
    assert _circles(_imports(REPO / "src", "guide_utils.runtime")) == []


def test_the_circle_check_finds_a_circle_closed_inside_a_function(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO / "src" / "guide_utils" / "runtime", src / "guide_utils" / "runtime")
    with open(src / "guide_utils" / "runtime" / "slurm.py", "a") as f:
        f.write("\n\ndef _late():\n    from .launchers import base  # noqa: F401\n")
    circles = _circles(_imports(src, "guide_utils.runtime"))
    assert any({"guide_utils.runtime.slurm", "guide_utils.runtime.launchers.base"} <= set(c) for c in circles), circles
