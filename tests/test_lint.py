"""Code reads well in the book and in the library: ruff (pinned in requirements.txt) checks line
lengths, 100 characters in notebook cells (what the book's content column shows, see
notebooks/ruff.toml) and 120 in src/, and unused or undefined names in notebooks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).parent / "ruff"


def test_ruff_passes_on_notebooks_and_src():
    proc = subprocess.run([str(RUFF), "check", "--no-cache", "--output-format", "concise", "notebooks", "src"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"ruff found problems (fix them, or wrap the lines):\n{proc.stdout}{proc.stderr}"


def test_the_notebook_limit_is_stricter_than_the_library_one(tmp_path):
    """The nested config really applies: a 101-character line fails in a notebook cell."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1  # " + "a" * 92)])
    (tmp_path / "notebooks").mkdir()
    nbformat.write(nb, tmp_path / "notebooks" / "long.ipynb")
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (tmp_path / "notebooks" / "ruff.toml").write_text((REPO / "notebooks" / "ruff.toml").read_text())
    proc = subprocess.run([str(RUFF), "check", "--no-cache", "notebooks"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "E501" in proc.stdout, proc.stdout + proc.stderr
