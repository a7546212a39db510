#!/usr/bin/env python
"""Build the Jupyter Book: what ``make book`` runs, and what the tests run.

1. The execution cache (jupyter-cache, in ``<output>/_build/.jupyter_cache``) is keyed by
   each notebook's code alone, so a change in ``guide_utils`` or in the locked packages
   would leave stale outputs in the book. A stamp of the library's files, the example
   scripts chapter 16 renders, and the pins is kept beside the cache; when it differs, the
   cache is emptied first.
2. Every notebook of ``_toc.yml`` that the cache lacks is executed once, two at a time (the
   notebooks spend much of their time starting processes and waiting for them).
3. ``jupyter-book build -W -n --keep-going`` then finds every notebook in the cache; any
   warning (a broken reference, a notebook that failed) fails the build.

    python scripts/book.py                          # into ./_build/html, like make book
    python scripts/book.py --path-output /tmp/book  # elsewhere (the tests)
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import yaml

REPO = Path(__file__).resolve().parents[1]
# What the notebooks' outputs depend on besides their own code.
STAMPED = ("src/guide_utils", "examples", "requirements.txt", "requirements.lock")
STAMP_FILE = "guide-stamp.txt"


def toc_notebooks(root: Path) -> list[Path]:
    """The notebooks the table of contents lists, in reading order."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    parts = toc.get("parts", []) or [{"chapters": toc.get("chapters", [])}]
    files = [toc["root"], *(ch["file"] for part in parts for ch in part.get("chapters", []))]
    return [root / f"{f}.ipynb" for f in files if (root / f"{f}.ipynb").exists()]


def stamp(root: Path) -> str:
    """A hash of every file the notebooks' outputs depend on besides their own code."""
    h = hashlib.sha256()
    for name in STAMPED:
        path = root / name
        files = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
            if path.is_dir() else [path] if path.exists() else []
        for f in files:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def fresh_cache(cache_dir: Path, root: Path):
    """``(cache, emptied)``: the jupyter-cache in ``cache_dir``, emptied if the library or the
    pins changed since it was filled."""
    from jupyter_cache import get_cache

    want = stamp(root)
    recorded = cache_dir / STAMP_FILE
    emptied = cache_dir.exists() and (not recorded.exists() or recorded.read_text() != want)
    if emptied:
        print(f"[book] the library or the locked packages changed: emptying the execution cache {cache_dir}")
        shutil.rmtree(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    cache = get_cache(str(cache_dir))
    recorded.write_text(want)
    return cache, emptied


KERNEL_CONFIG = '''# Written by scripts/book.py for the book build's kernels (IPYTHONDIR points here during it).
# The build's kernels talk to their executor over loopback TCP for seconds, and every output
# they send is published in the book; ipykernel's warning that this traffic is unencrypted
# is true but harmless here, so this one message is dropped. Every other kernel message stays.
import logging


class _LoopbackBuild(logging.Filter):
    def filter(self, record):
        return "running over TCP without encryption" not in record.getMessage()


logging.getLogger("IPKernelApp").addFilter(_LoopbackBuild())
'''


def quiet_kernels(build_dir: Path) -> None:
    """Point the build's kernels at an IPython profile of their own (KERNEL_CONFIG): no user
    start-up scripts, and no warning per notebook about loopback traffic."""
    profile = build_dir / ".ipython" / "profile_default"
    profile.mkdir(parents=True, exist_ok=True)
    (profile / "ipython_kernel_config.py").write_text(KERNEL_CONFIG)
    os.environ["IPYTHONDIR"] = str(build_dir / ".ipython")


def execute(cache, notebooks: list[Path], timeout: int) -> list[str]:
    """Execute the notebooks the cache lacks, in parallel; each once. The names of those that
    failed."""
    from jupyter_cache.executors import load_executor

    for nb in notebooks:
        cache.add_nb_to_project(str(nb))
    stale = [r for r in cache.list_project_records() if cache.get_cached_project_nb(r.uri) is None]
    if not stale:
        print(f"[book] all {len(notebooks)} notebooks come from the execution cache")
        return []
    at_once = min(len(stale), os.cpu_count() or 1)
    # Each kernel gets its share of the cores: torch would otherwise start one thread per
    # core in every kernel, and spinning threads on oversubscribed cores slow all of them.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // at_once)))
    print(f"[book] executing {len(stale)} notebook(s), {at_once} at a time, {os.environ['OMP_NUM_THREADS']} "
          "thread(s) each: " + ", ".join(Path(r.uri).stem for r in stale), flush=True)
    # Kernels talk to the executor over loopback TCP (jupyter_client's default). Not IPC:
    # its socket names are relative to each process's working directory, so an executor
    # and a kernel started in the notebook's folder never meet (measured: no kernel answered).
    logger = logging.getLogger("book")
    start = time.perf_counter()
    # A chapter run by a reader keeps its run records in a temporary folder of its own, to
    # look at afterwards; the build's kernels make theirs in one folder that goes with the
    # build (16 folders left in /tmp per build before).
    with (tempfile.TemporaryDirectory(prefix="guide-book-runs-", ignore_cleanup_errors=True) as tmp,
          mock.patch.dict(os.environ, TMPDIR=tmp)):
        result = load_executor("local-parallel", cache, logger=logger).run_and_cache(
            filter_pks=[r.pk for r in stale], timeout=timeout, allow_errors=False)
    for record in cache.list_cache_records():
        if any(record.uri == r.uri for r in stale):
            print(f"[book]   {Path(record.uri).stem}: {record.data.get('execution_seconds', 0):.0f} s")
    failed = [Path(u).stem for u in result.errored + result.excepted]
    print(f"[book] executed in {time.perf_counter() - start:.0f} s; failed: {', '.join(failed) or 'none'}",
          flush=True)
    return failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=REPO, help="the book's repository (default: this one)")
    p.add_argument("--path-output", type=Path, default=None, help="where _build goes (default: --root)")
    p.add_argument("--timeout", type=int, default=600, help="seconds one notebook may take")
    args = p.parse_args(argv)
    root = args.root.resolve()
    out = (args.path_output or root).resolve()
    logging.basicConfig(level=logging.WARNING, format="[book] %(message)s")
    cache, emptied = fresh_cache(out / "_build" / ".jupyter_cache", root)
    quiet_kernels(out / "_build")
    failed = execute(cache, toc_notebooks(root), args.timeout)
    if failed:  # jupyter-book would execute them again, one at a time, and fail the same way
        print(f"[book] error: {len(failed)} notebook(s) failed ({', '.join(failed)}): their tracebacks are "
              "above; fix them and build again (the others stay cached)", file=sys.stderr)
        return 1
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    cmd = [str(jupyter_book), "build", str(root), "-W", "-n", "--keep-going", "--path-output", str(out)]
    if emptied:  # Sphinx re-reads only changed sources: unchanged notebooks would keep stale pages
        cmd.append("--all")
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
