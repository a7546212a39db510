"""The whole Jupyter Book builds strictly, every notebook in it really ran (once), and the
outputs the notebooks keep for comparison still come out the same."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml
from nbval.plugin import coalesce_streams

REPO = Path(__file__).resolve().parents[1]
BOOK = [sys.executable, str(REPO / "scripts" / "book.py")]
sys.path.insert(0, str(REPO / "scripts"))
import book as book_script  # noqa: E402
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


def test_every_notebook_is_in_the_toc_and_back():
    on_disk = sorted(f"notebooks/{p.stem}" for p in (REPO / "notebooks").glob("*.ipynb"))
    assert on_disk == sorted(toc_notebooks())
    for f in toc_files():
        assert (REPO / f"{f}.md").exists() or (REPO / f"{f}.ipynb").exists(), f"{f} in _toc.yml does not exist"


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
    assert "k=32   linear+warmup" in page and "worst" in page and "within 1 point(s)" in page
    assert "measured 20" in page
    assert page.count("<img") >= 2  # the schedules and the quality figure


def test_the_build_prints_no_false_alarm(built_book):
    """A reader building the book sees no error that is not one: the profiler's GPU probe on a
    machine without a GPU, and ipykernel's loopback-encryption warning, once per notebook."""
    log = (built_book.parent / "build.log").read_text()
    assert "gpuGetDeviceCount" not in log and "without encryption" not in log
    assert "[book] executed in" in log and "; failed: none" in log


def test_the_build_kernels_drop_only_the_loopback_warning(tmp_path, monkeypatch):
    import logging
    import os

    monkeypatch.delenv("IPYTHONDIR", raising=False)  # and restored after the test
    book_script.quiet_kernels(tmp_path)
    config = Path(os.environ["IPYTHONDIR"]) / "profile_default" / "ipython_kernel_config.py"
    assert config.is_relative_to(tmp_path)
    logger = logging.getLogger("IPKernelApp")
    before = list(logger.filters)
    try:
        exec(compile(config.read_text(), str(config), "exec"), {})
        drop = logger.makeRecord("IPKernelApp", logging.WARNING, __file__, 1,
                                 "Kernel is running over TCP without encryption. All ...", None, None)
        keep = logger.makeRecord("IPKernelApp", logging.WARNING, __file__, 1, "Could not open the log", None, None)
        assert not logger.filter(drop) and logger.filter(keep)
    finally:
        logger.filters[:] = before


# --- the build itself, on a one-notebook book ------------------------------------------

PROBE = """import time
print("executed at", time.time_ns())"""


@pytest.fixture
def mini_book(tmp_path) -> Path:
    """A book of one notebook that prints when it ran, with a stand-in library and pins."""
    root = tmp_path / "mini"
    (root / "src" / "guide_utils").mkdir(parents=True)
    (root / "src" / "guide_utils" / "core.py").write_text("VERSION = 1\n")
    (root / "requirements.txt").write_text("numpy\n")
    (root / "requirements.lock").write_text("numpy==1.26.4\n")
    config = yaml.safe_load((REPO / "_config.yml").read_text())
    (root / "references.bib").write_text("")
    config["bibtex_bibfiles"] = ["references.bib"]
    config["exclude_patterns"] = ["src/*", "_build/*"]
    (root / "_config.yml").write_text(yaml.safe_dump(config))
    (root / "_toc.yml").write_text(yaml.safe_dump({"format": "jb-book", "root": "intro",
                                                   "chapters": [{"file": "probe"}]}))
    (root / "intro.md").write_text("# A one-notebook book\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Probe"), nbformat.v4.new_code_cell(PROBE)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "probe.ipynb")
    return root


def _build(root: Path) -> tuple[subprocess.CompletedProcess, str | None]:
    proc = subprocess.run([*BOOK, "--root", str(root), "--path-output", str(root)], capture_output=True, text=True,
                          timeout=600)
    page = root / "_build" / "html" / "probe.html"
    stamp = [w for w in page.read_text().split() if w.isdigit() and len(w) > 15] if page.exists() else []
    return proc, (stamp[0] if stamp else None)


def test_the_cache_is_emptied_when_the_library_or_the_pins_change(mini_book):
    first, ran_at = _build(mini_book)
    assert first.returncode == 0 and ran_at, first.stdout + first.stderr
    # executed by the build's own executor, not left for jupyter-book to execute one at a time
    assert "failed: none" in first.stdout, first.stdout + first.stderr
    again, cached_at = _build(mini_book)
    assert again.returncode == 0 and "come from the execution cache" in again.stdout
    assert cached_at == ran_at, "an unchanged book must come from the cache"
    (mini_book / "src" / "guide_utils" / "core.py").write_text("VERSION = 2\n")  # the library changed
    changed, rerun_at = _build(mini_book)
    assert changed.returncode == 0 and "emptying the execution cache" in changed.stdout, changed.stdout
    assert rerun_at not in (None, ran_at), "after a library change the notebook must run again"


def test_the_stamp_covers_library_and_pins(mini_book):
    before = book_script.stamp(mini_book)
    (mini_book / "requirements.lock").write_text("numpy==2.0.0\n")
    assert book_script.stamp(mini_book) != before
    (mini_book / "notes.md").write_text("prose does not change outputs\n")
    assert book_script.stamp(mini_book) == book_script.stamp(mini_book)


def test_a_failing_notebook_fails_the_build(mini_book):
    """The strict build must not publish a book whose notebook raised."""
    path = mini_book / "probe.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("raise RuntimeError('this cell is broken')"))
    nbformat.write(nb, path)
    proc, _ = _build(mini_book)
    assert proc.returncode != 0
    assert "this cell is broken" in proc.stdout + proc.stderr
    assert "[book] error: 1 notebook(s) failed (probe)" in proc.stderr
    assert not (mini_book / "_build" / "html").exists(), "nothing is published from a failed execution"
