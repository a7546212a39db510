"""Shared test helpers and the one book build of a test session."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# One thread per process, here and in every process the tests start: the book build runs
# beside the tests, so the two cores are always shared, and torch's default (a thread per
# core in every process) oversubscribes them. Set before torch loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


# A CI runner stops a job with SIGTERM. As an interruption, pytest still tears the fixtures
# down: the test Slurm's daemons, its jobs and the book build do not outlive the session.
signal.signal(signal.SIGTERM, _interrupted)

BOOK_TIMEOUT = 1150  # seconds left to wait for the book when its readers start (under pytest-timeout)


BIN = Path(sys.executable).parent  # the venv's commands (horovodrun, torchrun, mpirun wrappers)
# Open MPI refuses to start as root unless told twice (CI containers run as root).
MPI_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a process a test starts: this one's, unbuffered output (a killed
    child's last lines still arrive), one thread, the venv's commands first on the PATH, the
    dataset cache shared with the session; then ``extra``."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **extra)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("GUIDE_DATA_CACHE", str(Path.home() / ".cache" / "guide_utils"))
    return env


def make_image_tree(root: Path, splits=("train", "val"), classes=("cat", "dog"), per_class: int = 3) -> Path:
    """A tiny ImageFolder tree (root/split/class/i.png) of 40x40 RGB images."""
    from PIL import Image

    for split in splits:
        for cls in classes:
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                Image.new("RGB", (40, 40), (i * 80, 30, 200)).save(root / split / cls / f"{i}.png")
    return root


# --- the book, built once per session, in the background ------------------------------
# The book build executes every notebook; nothing else in the session needs it until the
# tests that read its output. So it starts as soon as the tests are collected and runs
# beside them, and those tests run last.

_BOOK: dict = {}


def _uses_the_book(item) -> bool:
    return "built_book" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_uses_the_book)  # stable: the book's readers last, in their own order


def pytest_collection_finish(session):
    if any(_uses_the_book(item) for item in session.items) and not _BOOK:
        out = Path(tempfile.mkdtemp(prefix="guide-book-"))
        log = open(out / "build.log", "w")
        _BOOK.update(out=out, log=log, proc=subprocess.Popen(
            [sys.executable, str(REPO / "scripts" / "book.py"), "--path-output", str(out)],
            stdout=log, stderr=subprocess.STDOUT, text=True))


def pytest_sessionfinish(session, exitstatus):
    proc = _BOOK.get("proc")
    if proc is not None and proc.poll() is None:  # interrupted: do not leave the build running
        proc.kill()
        proc.wait()
    if _BOOK:
        _BOOK["log"].close()
        if exitstatus == 0:
            shutil.rmtree(_BOOK["out"], ignore_errors=True)


@pytest.fixture(scope="session")
def built_book() -> Path:
    """The whole book, built once per session exactly as `make book` builds it (every notebook
    executed once), in a temporary directory; its ``_build`` folder. Every test that needs
    an executed notebook reads it from the build's execution cache (``test_book.executed``),
    and the HTML from ``_build/html``: no notebook runs twice."""
    if not _BOOK:
        pytest.fail("the book build did not start (no collected test asked for built_book)")
    try:
        code = _BOOK["proc"].wait(timeout=BOOK_TIMEOUT)
    except subprocess.TimeoutExpired:
        _BOOK["proc"].kill()
        pytest.fail(f"the book build took over {BOOK_TIMEOUT} s; its log: {_BOOK['out'] / 'build.log'}")
    log = (_BOOK["out"] / "build.log").read_text()
    if code != 0:
        reports = _BOOK["out"] / "_build" / "html" / "reports"
        where = reports if reports.exists() else "none"
        pytest.fail(f"the book build failed ({code}); reports: {where}\n{log[-6000:]}")
    print("\n".join(line for line in log.splitlines() if line.startswith("[book]")))
    return _BOOK["out"] / "_build"


# --- CPU time per test ----------------------------------------------------------------
# On a shared 2-core machine wall-clock durations say more about the neighbours than about
# a test; CPU seconds (this process and every child it waited for: launchers, workers,
# kernels) are what a test costs the CI budget. Jobs run by the test Slurm are the Slurm
# daemons' children and are not counted.

def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=0, metavar="N",
                     help="list the N tests that used the most CPU time (with their children)")


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_CPU: dict[str, float] = {}
_STARTED: dict[str, float] = {}


def pytest_runtest_setup(item):
    _STARTED[item.nodeid] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and item.nodeid in _STARTED:
        # In the report, so that it reaches the controller under pytest-xdist too.
        outcome.get_result().user_properties.append(("cpu_seconds", _cpu_seconds() - _STARTED.pop(item.nodeid)))


def pytest_runtest_logreport(report):
    for name, value in report.user_properties:
        if name == "cpu_seconds":
            _CPU[report.nodeid] = value


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    n = config.getoption("--cpu-durations")
    if not n or not _CPU:
        return
    terminalreporter.section(f"most CPU time (s, children included; total {sum(_CPU.values()):.0f} s)")
    for nodeid, cpu in sorted(_CPU.items(), key=lambda kv: -kv[1])[:n]:
        terminalreporter.write_line(f"{cpu:8.1f}  {nodeid}")
