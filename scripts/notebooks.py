#!/usr/bin/env python
"""The guide's notebook storage policy, checked and applied.

Notebooks are committed without outputs and with no execution counts (the book build runs
them), except cells whose first line is ``# NBVAL_CHECK_OUTPUT``: they keep the outputs that
nbval compares a fresh run against (and an execution count, without which nbval treats a
cell as never run), so those outputs must be deterministic.

    python scripts/notebooks.py check notebooks/*.ipynb      # exit 1 on any violation
    python scripts/notebooks.py refresh notebooks/00_environment.ipynb
                                  # execute, keep only the checked cells' outputs
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import nbformat
from papermill.translators import PythonTranslator

CHECK = "# NBVAL_CHECK_OUTPUT"


def is_checked(cell) -> bool:
    return cell.cell_type == "code" and cell.source.lstrip().startswith(CHECK)


def unread_parameters(name: str, cell) -> list[str]:
    """Names the parameters cell assigns that papermill cannot read: it parses each line with
    a pattern (an '=' in a comment defeats it), and then passes ``-p NAME`` on as an
    unknown parameter, so a batch job's override silently does nothing."""
    assigned = [t.id for node in ast.parse(cell.source).body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)]
    read = {p.name for p in PythonTranslator.inspect(cell)}
    return [f"{name}: papermill cannot read the parameter {n!r} (an '=' in its comment?)"
            for n in assigned if n not in read]


def check(path: Path) -> list[str]:
    """Violations of the policy in one notebook, as readable lines."""
    nb = nbformat.read(path, as_version=4)
    problems = []
    name = path.name
    if nb.metadata.get("kernelspec", {}).get("name") != "python3":
        problems.append(f"{name}: kernelspec name must be python3")
    if not nb.cells or nb.cells[0].cell_type != "markdown" or not nb.cells[0].source.startswith("# "):
        problems.append(f"{name}: the first cell must be markdown starting with a '# ' title")
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    if len(tagged) != 1:
        problems.append(f"{name}: needs exactly one cell tagged 'parameters' (has {len(tagged)})")
    else:
        problems += unread_parameters(name, tagged[0])
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if is_checked(cell):
            if cell.execution_count is None:
                problems.append(f"{name} cell {i}: {CHECK} cell needs its execution_count (nbval skips it otherwise)")
            if not cell.outputs:
                problems.append(f"{name} cell {i}: {CHECK} cell has no stored output to compare with")
            if any(o.output_type == "error" for o in cell.outputs):
                problems.append(f"{name} cell {i}: stored output is an error")
        elif cell.outputs or cell.execution_count is not None:
            problems.append(f"{name} cell {i}: outputs and execution_count must be stripped "
                            f"(only {CHECK} cells keep theirs)")
    return problems


def refresh(path: Path) -> None:
    """Execute the notebook, then keep only the checked cells' outputs."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    for cell in nb.cells:
        if cell.cell_type == "code" and not is_checked(cell):
            cell.execution_count = None
            cell.outputs = []
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("check", "refresh"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    paths = [Path(p) for p in argv[1:]]
    if argv[0] == "refresh":
        for p in paths:
            refresh(p)
        return 0
    problems = [line for p in paths for line in check(p)]
    print("\n".join(problems) or f"{len(paths)} notebook(s) follow the storage policy")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
