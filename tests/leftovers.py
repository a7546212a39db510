"""Nothing a test run starts may outlive it: the check at the end of every session.

A process belongs to a run when

* its environment carries the run's id in ``GUIDE_TEST_RUN``. conftest.py sets it in
  pytest's controller before anything starts, so the xdist workers inherit it, and from them
  every process a test starts: launchers and ranks, the book build and its kernels, hubs,
  engines, the test Slurm's daemons and (sbatch passes the environment on) its jobs. A run
  inside a test appends its own id to the one it inherited (``outer,inner``);
* or its working folder or an open file lies in one of the run's folders: pytest's base
  temporary folder, and those a test names with :func:`own` (a folder it made elsewhere).
  slurmstepd needs this: it overwrites its environment with its title ("slurmstepd:
  [2504.batch]"), is no child of anything the run started (slurmd forks it off), and holds
  its node's log in the test Slurm's folder open;
* or it descends from such a process, whatever its environment.

At the end of the session, on the controller, once the workers have exited, :func:`check`
waits a few seconds for the run's processes to finish ending, then kills those still there;
the run fails, and its summary names each one. Other processes (another run's, another
user's, pytest's controller itself) are never touched.

conftest.py calls :func:`pytest_configure` and :func:`pytest_configure_node`; a pytest run
without it gets the same check with ``-p leftovers`` (tests/test_leftovers.py does).
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
import uuid
from pathlib import Path

import pytest

VAR = "GUIDE_TEST_RUN"
GRACE_S = 15.0  # for the last processes to finish ending (a worker's children, a stepd)
GRACE_VAR = "GUIDE_LEFTOVERS_GRACE_S"  # another grace, in seconds (a test of the check)
PROC = Path("/proc")


def tag() -> str:
    """A new id for this run, set in ``os.environ`` (after an enclosing run's, if any); returns it."""
    run = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    outer = os.environ.get(VAR)
    os.environ[VAR] = f"{outer},{run}" if outer else run
    return run


def _registry(run: str) -> Path:
    return Path(tempfile.gettempdir()) / f"guide-test-run-{run}.folders"


def own(folder: Path | str) -> None:
    """Name a folder of this run outside pytest's temporary folder: a process still holding a
    file in it (or working in it) when the run ends is the run's."""
    for run in filter(None, os.environ.get(VAR, "").split(",")):
        with open(_registry(run), "a") as f:
            f.write(f"{Path(folder).resolve()}\n")


def folders(run: str) -> list[str]:
    """The folders named with :func:`own` during ``run``."""
    with contextlib.suppress(OSError):
        return [line for line in _registry(run).read_text().splitlines() if line]
    return []


def _pids() -> list[int]:
    return [int(e) for e in os.listdir(PROC) if e.isdigit()]


def _carries(pid: int, run: str) -> bool:
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:  # gone, a kernel thread, or not ours to read
        return False
    prefix = f"{VAR}=".encode()
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            return run in item[len(prefix):].decode(errors="replace").split(",")
    return False


def _holds(pid: int, inside: tuple[str, ...]) -> bool:
    """Whether the process works in, or has a file open in, one of the folders ``inside``
    (each ending in '/')."""
    if not inside:
        return False
    links = [PROC / str(pid) / "cwd"]
    with contextlib.suppress(OSError):
        links += [PROC / str(pid) / "fd" / fd for fd in os.listdir(PROC / str(pid) / "fd")]
    for link in links:
        with contextlib.suppress(OSError):
            if (os.readlink(link).removesuffix(" (deleted)") + "/").startswith(inside):
                return True
    return False


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process; None once it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and ')'
    return fields[0], int(fields[1])


def describe(pid: int) -> str:
    try:
        cmd = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "(gone)"
    return f"pid {pid}: {cmd[:200] or '(no command line)'}"


def alive(run: str, inside=(), exclude=()) -> dict[int, str]:
    """This run's processes now (zombies aside): those carrying its id, those holding a file
    in one of the folders ``inside``, and every process descended from one of them; pid ->
    what it is. ``exclude`` (and this process) are left out."""
    exclude = {os.getpid(), *exclude}
    inside = tuple(str(Path(f)).rstrip("/") + "/" for f in inside)
    stats = {pid: s for pid in _pids() if pid not in exclude and (s := _stat(pid)) is not None and s[0] != "Z"}
    # This process's own helpers (multiprocessing's resource tracker, a forkserver), which a
    # test running here started and which end with this process, a moment after the check.
    stats = {pid: s for pid, s in stats.items() if not (s[1] == os.getpid() and _helper(pid))}
    found = {pid for pid in stats if _carries(pid, run) or _holds(pid, inside)}
    grew = True
    while grew:  # children of the run's processes, whatever their environment
        more = {pid for pid, (_, parent) in stats.items() if parent in found and pid not in found}
        found |= more
        grew = bool(more)
    return {pid: describe(pid) for pid in sorted(found)}


def _helper(pid: int) -> bool:
    with contextlib.suppress(OSError):
        cmd = (PROC / str(pid) / "cmdline").read_bytes()
        return b"multiprocessing.resource_tracker" in cmd or b"multiprocessing.forkserver" in cmd
    return False


def kill(pids, wait_s: float = 10.0) -> None:
    """SIGKILL each of ``pids`` and wait until they are gone (or zombies)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        if all((s := _stat(pid)) is None or s[0] == "Z" for pid in pids):
            return
        time.sleep(0.1)


def check(run: str, grace_s: float = GRACE_S, inside=(), exclude=()) -> dict[int, str]:
    """The run's processes that outlived it (see :func:`alive`): waited for up to ``grace_s``,
    then killed; pid -> what each was (empty when none)."""
    end = time.monotonic() + grace_s
    left = alive(run, inside, exclude)
    while left and time.monotonic() < end:
        time.sleep(0.5)
        left = alive(run, inside, exclude)
    if left:
        kill(list(left))
    return left


# -- the plugin -----------------------------------------------------------------------------

class Check:
    """Registered on the controller: at the end of the session, once xdist has stopped its
    workers (and conftest.py the book build), this run's processes still running are killed
    and the run fails naming them."""

    def __init__(self, run: str):
        self.run = run
        self.left: dict[int, str] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        # pytest's base temporary folder, if this run made one (xdist's workers' are inside it)
        base = getattr(getattr(session.config, "_tmp_path_factory", None), "_basetemp", None)
        inside = [*([base] if base else []), *folders(self.run)]
        self.left = check(self.run, float(os.environ.get(GRACE_VAR, GRACE_S)), inside)
        _registry(self.run).unlink(missing_ok=True)
        if self.left and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if self.left:
            terminalreporter.section("processes this run started that outlived it (killed now)", red=True)
            for what in self.left.values():
                terminalreporter.write_line(what)
            terminalreporter.write_line("a test left these running: its teardown must stop every process, "
                                        "daemon, job and step it starts (tests/leftovers.py)")


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # an xdist worker: the controller's id (it set it before starting us)
        os.environ[VAR] = config.workerinput.get("guide_run", os.environ.get(VAR, ""))
    elif not config.pluginmanager.has_plugin("guide-leftovers"):
        config.pluginmanager.register(Check(tag()), "guide-leftovers")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["guide_run"] = os.environ[VAR]
