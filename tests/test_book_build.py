"""The book build itself (scripts/book.py), on a one-notebook book: its execution cache, its
kernels, its failures; and the table of contents against the notebooks on disk. None of
these needs the session's whole-book build (test_book.py reads that)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from test_book import toc_files, toc_notebooks

REPO = Path(__file__).resolve().parents[1]
BOOK = [sys.executable, str(REPO / "scripts" / "book.py")]
sys.path.insert(0, str(REPO / "scripts"))
import book as book_script  # noqa: E402

pytestmark = [pytest.mark.book, pytest.mark.slow, pytest.mark.notebooks]


def test_every_notebook_is_in_the_toc_and_back():
    on_disk = sorted(f"notebooks/{p.stem}" for p in (REPO / "notebooks").glob("*.ipynb"))
    assert on_disk == sorted(toc_notebooks())
    for f in toc_files():
        assert (REPO / f"{f}.md").exists() or (REPO / f"{f}.ipynb").exists(), f"{f} in _toc.yml does not exist"


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

PROBE = """import tempfile, time
print("executed at", time.time_ns())
print("records in", tempfile.mkdtemp(prefix="guide-probe-"))"""


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
    # the kernel's temporary folders were the build's, and went with it
    (records,) = re.findall(r"records in (\S+)", (mini_book / "_build" / "html" / "probe.html").read_text())
    assert Path(records).parent.name.startswith("guide-book-runs-") and not Path(records).parent.exists(), records
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
