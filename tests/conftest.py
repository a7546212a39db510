"""Shared test helpers and the one book build of a test session."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import host_speed
import leftovers
# A test broken by a Slurm daemon's crash runs once more (see there).
from slurm_rerun import pytest_runtest_call  # noqa: F401

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

# A cell of the book may take 600 s in `make book`; here the build shares the two cores with
# two test workers and their jobs, so it gets three times that: chapter 0's retraining (about
# 300 CPU-seconds) runs while the Slurm examples' burst of jobs holds the cores, and took
# over 1,200 s there (two CI runs on 2026-11-27).
BOOK_CELL_TIMEOUT = 1800
BOOK_TIMEOUT = 1150  # seconds left to wait for the book when its readers start (under pytest-timeout)


BIN = Path(sys.executable).parent  # the venv's commands (horovodrun, torchrun, mpirun wrappers)
# Open MPI refuses to start as root unless told twice (CI containers run as root).
MPI_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a process a test starts: this one's, unbuffered output (a killed
    child's last lines still arrive), one thread, OpenMPI ranks that yield their core while
    they wait (the tests share two cores; no number changes, as the CI site profile does), the
    venv's commands first on the PATH, the dataset cache shared with the session; then ``extra``."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **extra)
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
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


# A JupyterHub configuration file (tests/test_jupyterhub.py), not a module to import.
collect_ignore = ["jupyterhub_config.py"]

# --- the book, built once per session, in the background ------------------------------
# The book build executes every notebook; nothing else in the session needs it until the
# tests that read its output (test_book*.py's readers, BOOK_FILES). So it starts as soon as
# the tests are collected, beside them, and its readers run last. Under pytest-xdist the
# controller owns the build (a worker may be shut down while another still reads it): the
# workers find it by its folder, and its exit status in a file there once it has ended.

BOOK_FILES = ("tests/test_book.py", "tests/test_book_browser.py")  # every reader of the build, only them
_BOOK: dict = {}


def _uses_the_book(item) -> bool:
    return "built_book" in getattr(item, "fixturenames", ())


def _in_book_files(nodeid: str) -> bool:
    return nodeid.split("::", 1)[0] in BOOK_FILES


# A browser that waits for notebook cells training on engines in Slurm jobs: not at the start,
# where the book build and the Slurm examples' burst of jobs share the two cores (there its
# cells took over 600 s; 46 s on a quiet machine), but after the other modules.
LATE_FILES = ("tests/test_jupyterhub.py",)
# The longest of the other modules (2 to 3 minutes each in a CI run) right after the Slurm
# ones: the two workers take one module at a time, so a long one taken last kept one worker
# busy while the other sat idle at the end (test_your_script.py, last by name, in ci33).
# Before them the doctor's, which mostly waits for probes to stall: while the book build
# runs, its waiting leaves no core idle; after it, it did (ci38's timeline).
EARLY_FILES = ("tests/test_doctor.py", "tests/test_engine.py", "tests/test_your_script.py", "tests/test_study.py")


def _order(item) -> tuple[bool, int]:
    """Slurm modules first (their jobs run beside everything else), then the longest other
    ones, then the rest, then the late ones, the book's readers last."""
    path = item.nodeid.split("::", 1)[0]
    rank = 0 if "slurm" in item.keywords else 1 if path in EARLY_FILES else 2 if path not in LATE_FILES else 3
    return (_in_book_files(item.nodeid), rank)


def pytest_collection_modifyitems(session, config, items):
    stray = [i.nodeid for i in items if _uses_the_book(i) and not _in_book_files(i.nodeid)]
    if stray:
        raise pytest.UsageError(f"{stray[0]} reads the book build: move it to one of {BOOK_FILES} "
                                "(they run as one unit after the build)")
    items.sort(key=_order)  # stable: otherwise the files' order


def _controller(config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config):
    if _controller(config):
        _BOOK["out"] = Path(tempfile.mkdtemp(prefix="guide-book-"))
    # Before anything starts: every process of this run carries its id, and what outlives
    # the run fails it (tests/leftovers.py).
    leftovers.pytest_configure(config)


def _start_book() -> None:
    if "proc" in _BOOK:
        return
    out = _BOOK["out"]
    _BOOK["started"] = time.time()
    # The exit status goes to a file only after the build has ended: what the workers wait for.
    _BOOK["proc"] = subprocess.Popen(
        ["sh", "-c", '"$@" >"$0/build.log" 2>&1; s=$?; times >"$0/times"; echo $s >"$0/status.tmp"; '
                     'mv "$0/status.tmp" "$0/status"',
         str(out), sys.executable, str(REPO / "scripts" / "book.py"), "--path-output", str(out),
         "--timeout", str(BOOK_CELL_TIMEOUT)],
        start_new_session=True)


def pytest_collection_finish(session):
    """Without xdist: this process collected and runs the tests."""
    if _controller(session.config) and any(_uses_the_book(item) for item in session.items):
        _start_book()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["guide_book"] = str(_BOOK["out"])
    leftovers.pytest_configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    if any(_in_book_files(nodeid) for nodeid in ids):
        _start_book()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        """xdist's loadscope in the collection's order (Slurm modules first, the book last):
        each test file is one unit, so its module fixtures (a test Slurm, a batch of jobs)
        exist once; the book's readers are one unit."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            config.option.loadscopereorder = False

        def _split_scope(self, nodeid: str) -> str:
            return "the book" if _in_book_files(nodeid) else nodeid.split("::", 1)[0]

    return ByModule(config, log)


def _children_cpu(path: Path) -> float | None:
    """User and system CPU-seconds of the processes a shell waited for, from its ``times``
    output ("0m0.01s 0m0.00s" for the shell, then the same for its children); None if absent."""
    try:
        lines = path.read_text().splitlines()
        return sum(int(m) * 60 + float(sec) for m, sec in re.findall(r"(\d+)m([\d.]+)s", lines[1]))
    except (OSError, IndexError, ValueError):
        return None


def pytest_sessionfinish(session, exitstatus):
    if not _controller(session.config) or "out" not in _BOOK:
        return
    proc = _BOOK.get("proc")
    if proc is not None and proc.poll() is None:  # interrupted: do not leave the build running
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    status = _BOOK["out"] / "status"
    if status.exists():  # when the book, beside the tests, was ready (the folder goes below)
        _BOOK["built"] = status.stat().st_mtime
        _BOOK["took"] = f"{_BOOK['built'] - _BOOK['started']:.0f} s, exit status {status.read_text().strip()}"
        cpu = _children_cpu(_BOOK["out"] / "times")
        _BOOK["took"] += f", {cpu:,.0f} CPU-s" if cpu is not None else ""
    if exitstatus == 0 or proc is None:
        shutil.rmtree(_BOOK["out"], ignore_errors=True)


@pytest.fixture(scope="session")
def built_book(request) -> Path:
    """The whole book, built once per session exactly as `make book` builds it (every notebook
    executed once), in a temporary directory; its ``_build`` folder. Every test that needs
    an executed notebook reads it from the build's execution cache (``test_book.executed``),
    and the HTML from ``_build/html``: no notebook runs twice."""
    config = request.config
    out = Path(config.workerinput["guide_book"]) if not _controller(config) else _BOOK["out"]
    status, deadline = out / "status", time.monotonic() + BOOK_TIMEOUT
    while not status.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the book build took over {BOOK_TIMEOUT} s more; its log: {out / 'build.log'}")
        time.sleep(1)
    code = int(status.read_text())
    log = (out / "build.log").read_text()
    if code != 0:
        reports = out / "_build" / "html" / "reports"
        where = reports if reports.exists() else "none"
        pytest.fail(f"the book build failed ({code}); reports: {where}\n{log[-6000:]}")
    print("\n".join(line for line in log.splitlines() if line.startswith("[book]")))
    return out / "_build"


# --- CPU time per test ----------------------------------------------------------------
# On a shared 2-core machine wall-clock durations say more about the neighbours than about
# a test; CPU seconds (this process and every child it waited for: launchers, workers,
# kernels) are what a test costs the CI budget. Jobs run by the test Slurm are the Slurm
# daemons' children and are not counted.

def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=0, metavar="N",
                     help="list the N tests that used the most CPU time (with their children)")
    parser.addoption("--host-speed", action="store_true",
                     help="report the machine's busy CPU time over the session and a reference step's "
                          "time at its start and end (tests/host_speed.py)")


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




# Where the wall time went: each test file's span on the worker that ran it (the CI budget is
# set by the longest chain, not by the total).
_SPANS: dict[tuple[str, str], list[float]] = {}


def pytest_runtest_logreport(report):
    # One hook for both records: a second function of the same name in this module would
    # replace the first (the CPU table was empty for that reason).
    for name, value in report.user_properties:
        if name == "cpu_seconds":
            _CPU[report.nodeid] = value
    worker = getattr(getattr(report, "node", None), "gateway", None)
    key = (getattr(worker, "id", "main"), report.nodeid.split("::", 1)[0])
    span = _SPANS.setdefault(key, [report.start, report.stop])
    span[0], span[1] = min(span[0], report.start), max(span[1], report.stop)


def _timeline(terminalreporter) -> None:
    if not _SPANS:
        return
    starts = [start for start, _ in _SPANS.values()] + ([_BOOK["started"]] if "built" in _BOOK else [])
    zero = min(starts)
    terminalreporter.section("timeline (s from the first test or the book build's start; test files of 30 s or "
                             "more)")
    if "built" in _BOOK:
        terminalreporter.write_line(f"{'book':5} {_BOOK['started'] - zero:7.0f} {_BOOK['built'] - zero:7.0f}  "
                                    "the book build")
    for (worker, path), (start, stop) in sorted(_SPANS.items(), key=lambda kv: (kv[0][0], kv[1][0])):
        if stop - start >= 30:
            terminalreporter.write_line(f"{worker:5} {start - zero:7.0f} {stop - zero:7.0f}  {path}")


_HOST: dict = {}


def pytest_sessionstart(session):
    if session.config.getoption("--host-speed") and _controller(session.config):
        try:  # a machine without /proc/stat gets no report, and the session runs as usual
            _HOST.update(busy=host_speed.busy_seconds(), wall=time.monotonic(), step=host_speed.step_ms())
        except (OSError, ValueError) as exc:
            print(f"--host-speed: no report on this machine ({exc})")
            return
        try:  # memory: the peak in use, sampled every second, and the kernel's OOM kills
            _HOST.update(oom=host_speed.oom_kills(), peak=(0.0, 0.0, 0.0))
            threading.Thread(target=_sample_memory, daemon=True).start()
        except (OSError, ValueError):
            pass


def _sample_memory() -> None:
    while True:
        used, total = host_speed.memory_in_use()
        if used > _HOST["peak"][0]:
            _HOST["peak"] = (used, total, time.monotonic() - _HOST["wall"])
        time.sleep(1)


def _host_report(terminalreporter) -> None:
    busy, steal = (now - then for now, then in zip(host_speed.busy_seconds(), _HOST["busy"]))
    wall, cores = time.monotonic() - _HOST["wall"], os.cpu_count() or 1
    terminalreporter.section("this machine during the session (tests/host_speed.py)")
    terminalreporter.write_line(f"{busy:,.0f} CPU-s busy in {wall:,.0f} s on {cores} cores "
                                f"({busy / (wall * cores):.0%}), {steal:,.0f} s stolen by the host")
    terminalreporter.write_line(f"reference step (MNIST-1D CNN, batch 1024, 1 thread): {_HOST['step']} at the "
                                f"start, {host_speed.step_ms()} at the end")
    if "oom" in _HOST:
        used, total, at = _HOST["peak"]
        kills = host_speed.oom_kills() - _HOST["oom"]
        terminalreporter.write_line(f"memory: at most {used:.1f} of {total:.1f} GiB in use ({at:.0f} s in); "
                                    f"{kills} process(es) killed by the kernel for want of memory")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _HOST:
        _host_report(terminalreporter)
    if "took" in _BOOK:
        terminalreporter.write_line(f"the book build (every notebook once, beside the tests): {_BOOK['took']}")
    _timeline(terminalreporter)
    n = config.getoption("--cpu-durations")
    if not n or not _CPU:
        return
    terminalreporter.section(f"most CPU time (s, children included; total {sum(_CPU.values()):.0f} s)")
    for nodeid, cpu in sorted(_CPU.items(), key=lambda kv: -kv[1])[:n]:
        terminalreporter.write_line(f"{cpu:8.1f}  {nodeid}")
