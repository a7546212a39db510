"""The whole Jupyter Book builds strictly, every notebook in it really ran (once), and the
outputs the notebooks keep for comparison still come out the same.

Every test here reads the session's one book build (``built_book``), and only those: the
tests run as one unit after the build (conftest.py); the build's own behaviour is tested
on a one-notebook book in test_book_build.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
import yaml
from nbval.plugin import coalesce_streams

from guide_utils.studies import sweep

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import notebooks as notebook_policy  # noqa: E402

pytestmark = [pytest.mark.book, pytest.mark.slow, pytest.mark.notebooks]


def toc_files() -> list[str]:
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [ch["file"] for ch in part.get("chapters", [])]
    return files


def toc_notebooks() -> list[str]:
    return [f for f in toc_files() if (REPO / f"{f}.ipynb").exists()]


def test_book_has_its_pages(built_book):
    html = built_book / "html"
    assert (html / "index.html").exists()
    for f in toc_files():
        assert (html / f"{f}.html").exists(), f"no page for {f}"


def executed(built_book: Path, name: str) -> nbformat.NotebookNode:
    """The notebook as the build executed it: its code matched in the build's execution cache,
    with the cached outputs merged in, which is what the HTML shows. (The copy myst-nb writes to
    ``jupyter_execute/`` is the source notebook without those outputs: comparing with it would
    compare the stored outputs with themselves.)"""
    from jupyter_cache import get_cache

    cache = get_cache(str(built_book / ".jupyter_cache"))
    try:
        _, nb = cache.merge_match_into_file(str(REPO / f"{name}.ipynb"))
    except KeyError:
        pytest.fail(f"{name} was not executed by the build (no match in its execution cache)")
    return nb


@pytest.mark.parametrize("name", toc_notebooks())
def test_notebook_was_executed_without_errors(built_book, name):
    nb = executed(built_book, name)
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert code, f"{name} has no code"
    unrun = [i for i, c in enumerate(code) if c.execution_count is None]
    assert not unrun, f"{name}: code cells {unrun} were not executed"
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{name}: error output {errors[0].get('ename')}: {errors[0].get('evalue')}"
    # A notebook that "ran" without printing anything at all did not really run.
    assert any(c.outputs for c in code), f"{name}: no cell produced output"


def _comparable(outputs) -> list:
    """What nbval compares: streams merged per name, text and data, not images or metadata."""
    out = []
    for o in coalesce_streams([nbformat.from_dict(json.loads(json.dumps(o))) for o in outputs]):
        if o.output_type == "stream":
            out.append((o.name, o.text))
        elif o.output_type in ("execute_result", "display_data"):
            out.append({k: v for k, v in o.get("data", {}).items() if k.startswith("text/") and k != "text/latex"})
        else:
            out.append((o.output_type, o.get("ename"), o.get("evalue")))
    return out


CHECKED = [(name, i) for name in toc_notebooks()
           for i, cell in enumerate(nbformat.read(REPO / f"{name}.ipynb", as_version=4).cells)
           if notebook_policy.is_checked(cell)]


@pytest.mark.parametrize("name, index", CHECKED, ids=[f"{n.split('/')[-1]}-cell{i}" for n, i in CHECKED])
def test_checked_outputs_are_reproduced(built_book, name, index):
    """nbval's check (the cells marked # NBVAL_CHECK_OUTPUT keep their outputs, which a new run
    must reproduce), against the book build's execution instead of a second one."""
    stored = nbformat.read(REPO / f"{name}.ipynb", as_version=4).cells[index]
    ran = executed(built_book, name).cells[index]
    assert ran.source == stored.source, f"{name} cell {index}: the executed notebook is not this one"
    assert _comparable(ran.outputs) == _comparable(stored.outputs), (
        f"{name} cell {index} printed something else; if that is intended, run "
        f"scripts/notebooks.py refresh {name}.ipynb")


def test_html_shows_the_executed_output(built_book):
    page = (built_book / "html" / "notebooks" / "00_environment.html").read_text()
    assert "stack usable: yes" in page
    assert "final weights agree" in page
    assert "verdict: the guide&#39;s conclusions hold on this machine" in page or \
        "verdict: the guide's conclusions hold on this machine" in page
    # chapter 6: the recorded sweep's figure with each point's median, worst run and count under it
    page = (built_book / "html" / "notebooks" / "06_learning_rate_warmup.html").read_text()
    limit = sweep.outcomes(sweep.recorded()).query("method == 'baseline'")["limit"].iloc[0]
    assert "k=32   linear+warmup" in page and "worst" in page and f"near the baseline (&lt;= {limit:.2f} %)" in page
    assert page.count("<img") >= 2  # the schedules and the quality figure
    # chapter 4 prints the recorded sweep's provenance (where, when, which commit) under its figure
    assert "measured 20" in (built_book / "html" / "notebooks" / "04_naive_scaling.html").read_text()


def test_the_build_prints_no_false_alarm(built_book):
    """A reader building the book sees no error that is not one: the profiler's GPU probe on a
    machine without a GPU, and ipykernel's loopback-encryption warning, once per notebook."""
    log = (built_book.parent / "build.log").read_text()
    assert "gpuGetDeviceCount" not in log and "without encryption" not in log
    assert "[book] executed in" in log and "; failed: none" in log
