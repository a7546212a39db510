"""The whole Jupyter Book builds strictly, and every notebook in it really ran."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
JB = Path(sys.executable).parent / "jupyter-book"

pytestmark = [pytest.mark.book, pytest.mark.slow, pytest.mark.notebooks]


def toc_files() -> list[str]:
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [ch["file"] for ch in part.get("chapters", [])]
    return files


def toc_notebooks() -> list[str]:
    return [f for f in toc_files() if (REPO / f"{f}.ipynb").exists()]


def test_every_notebook_is_in_the_toc_and_back():
    on_disk = sorted(f"notebooks/{p.stem}" for p in (REPO / "notebooks").glob("*.ipynb"))
    assert on_disk == sorted(toc_notebooks())
    for f in toc_files():
        assert (REPO / f"{f}.md").exists() or (REPO / f"{f}.ipynb").exists(), f"{f} in _toc.yml does not exist"


@pytest.fixture(scope="module")
def built_book(tmp_path_factory):
    """Build into a temporary directory with the same command as `make book` (never the repo's _build)."""
    out = tmp_path_factory.mktemp("book")
    proc = subprocess.run([str(JB), "build", str(REPO), "-W", "-n", "--keep-going", "--path-output", str(out)],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        reports = out / "_build" / "html" / "reports"
        pytest.fail(f"jupyter-book build failed ({proc.returncode}); reports: {reports if reports.exists() else 'none'}\n"
                    f"{(proc.stdout + proc.stderr)[-6000:]}")
    return out / "_build"


def test_book_has_its_pages(built_book):
    html = built_book / "html"
    assert (html / "index.html").exists()
    for f in toc_files():
        assert (html / f"{f}.html").exists(), f"no page for {f}"


@pytest.mark.parametrize("name", toc_notebooks())
def test_notebook_was_executed_without_errors(built_book, name):
    executed = built_book / "jupyter_execute" / f"{name}.ipynb"
    assert executed.exists(), f"{name} was not executed by the build"
    nb = nbformat.read(executed, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert code, f"{name} has no code"
    unrun = [i for i, c in enumerate(code) if c.execution_count is None]
    assert not unrun, f"{name}: code cells {unrun} were not executed"
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{name}: error output {errors[0].get('ename')}: {errors[0].get('evalue')}"
    # A notebook that "ran" without printing anything at all did not really run.
    assert any(c.outputs for c in code), f"{name}: no cell produced output"


def test_html_shows_the_executed_output(built_book):
    page = (built_book / "html" / "notebooks" / "00_environment.html").read_text()
    assert "stack usable: yes" in page
    assert "final weights agree" in page
    # chapter 6: the recorded sweep's figure with its numbers and spreads printed under it
    page = (built_book / "html" / "notebooks" / "06_learning_rate_warmup.html").read_text()
    assert "k=32  linear+warmup" in page and "+- " in page and "measured 20" in page
    assert page.count("<img") >= 2  # the schedules and the quality figure


def test_a_failing_notebook_fails_the_build(tmp_path):
    """The strict build must not publish a book whose notebook raised."""
    copy = tmp_path / "repo"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".venv", "_build", ".git", "results", "__pycache__"))
    path = copy / "notebooks" / "00_environment.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(2, nbformat.v4.new_code_cell("raise RuntimeError('this cell is broken')"))
    nbformat.write(nb, path)
    proc = subprocess.run([str(JB), "build", str(copy), "-W", "-n", "--keep-going"], capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode != 0
    assert "this cell is broken" in proc.stdout + proc.stderr
