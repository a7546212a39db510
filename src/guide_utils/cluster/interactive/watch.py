"""No silent hang: what ends a training on engines that has stopped getting anywhere.

While the engines train, :class:`Watch` looks, every half second, at what the notebook can
see of them, and names the first thing that is wrong in one line:

* an engine's part of the run failed while the others wait for it in a collective, where
  they would wait forever (ipyparallel's result is ready only when every part is): an
  exception on one rank, or the controller declared the engine dead, because its process
  ended (ipyparallel's nanny reports that at once) or it missed the controller's heartbeats
  for about 30 s (frozen, its node gone);
* the engines' launcher ended (``mpiexec`` exited; the Slurm job left the queue or stopped
  running);
* an engine never started the run (a request that never reached it: every engine says so
  in its first line, within ``join`` seconds);
* an epoch took longer than its deadline: the first ``first_epoch`` seconds from the
  request (start-up included), each later one ``factor`` times the first (as rank 0 timed
  it), at least ``floor`` seconds.

The line names the engine (its id, MPI rank, host and process), its last output, and what
to do; the caller stops the cluster, whose engines, inside a collective, cannot be reused.
In the last two cases the engines may all be alive and stuck: first every engine writes its
threads' stacks to its output (SIGUSR2; ``STACKS_ON_SIGNAL``), which is shown above the line.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

# What each engine prints first when it starts the run (remote.run_on_engine); never shown.
STARTED = "[engine] rank {rank} of {size} on {host} (pid {pid}): started"
# Seconds an exception on some ranks may stand while the others run on before the run is
# stopped: raised on every rank alike (a bad setting) it is the run's result, shown as such.
FAILED_ALONE = 10.0
PENDING = object()
# What every engine runs first: its threads' stacks to its output (mpiexec's, the Slurm job's
# log) on SIGUSR2, which the watch sends to a run that hangs; seconds it waits for them.
STACKS_ON_SIGNAL = ("import faulthandler, signal, sys; "
                    "faulthandler.register(signal.SIGUSR2, file=sys.__stderr__, all_threads=True)")
STACKS_WAIT = 2.0


@dataclass(frozen=True)
class Deadlines:
    """How long a training on engines may go without news; seconds. See the module doc."""

    first_epoch: float = 3600.0  # from the request to the first epoch's line: start-up included
    factor: float = 3.0          # each later epoch (and the end after the last): this many first epochs,
    floor: float = 60.0          # but at least this many seconds
    join: float = 30.0           # every engine has started the run
    check: float = 5.0           # between looks at the engines' launcher (mpiexec, the Slurm job)

    def epoch_limit(self, first: float | None) -> float:
        """The seconds an epoch may take, given the first one's (None: it is the first)."""
        return self.first_epoch if first is None else max(self.floor, self.factor * first)


class Engine(NamedTuple):
    """One engine of the run: ipyparallel's id, its MPI rank, host and process id."""

    eid: int
    rank: int
    host: str
    pid: int

    def name(self) -> str:
        return f"engine {self.eid} (rank {self.rank} on {self.host}, pid {self.pid})"


def last_line(*texts: str | None, width: int = 120) -> str:
    """The last line that is not empty of the texts, shortened; '(none)' when there is none.

    >>> last_line("a\\nb\\n\\n", None), last_line("")
    ("'b'", '(none)')
    """
    lines = [line.strip() for text in texts if text for line in text.replace("\r", "\n").splitlines() if line.strip()]
    if not lines:
        return "(none)"
    line = lines[-1]
    return repr(line if len(line) <= width else line[: width - 3] + "...")


def _seconds(s: float) -> str:
    """
    >>> _seconds(0.437), _seconds(6), _seconds(125.3)
    ('0.4', '6.0', '125')
    """
    return f"{s:.1f}" if s < 10 else f"{s:.0f}"


def stopped_here(engine: Engine) -> str | None:
    """How an engine on this host is not running ("stopped (SIGSTOP)", "gone", ...), or None."""
    if engine.host != socket.gethostname() or engine.pid <= 0:
        return None
    import psutil

    try:
        status = psutil.Process(engine.pid).status()
    except psutil.NoSuchProcess:
        return "gone (its process ended)"
    frozen = {psutil.STATUS_STOPPED: "stopped (SIGSTOP or a debugger)", psutil.STATUS_TRACING_STOP: "stopped by a "
              "debugger", psutil.STATUS_ZOMBIE: "dead (a zombie)", psutil.STATUS_DEAD: "dead"}
    return frozen.get(status)


def ask_for_stacks(engines: list[Engine], job_id: str | None) -> None:
    """SIGUSR2 to the engines (through Slurm for a job's; to this host's processes otherwise)."""
    if job_id:
        subprocess.run(["scancel", "--signal=USR2", str(job_id)], capture_output=True, timeout=60)
        return
    for engine in engines:
        if engine.host == socket.gethostname() and engine.pid > 0:
            try:
                os.kill(engine.pid, signal.SIGUSR2)
            except ProcessLookupError:
                pass


class Watch:
    """The deadlines and the engines of one training; :meth:`check` says what is wrong, or None.

    ``engines``: rank order, as the request went out. ``ended``: the launcher's state (a
    sentence when it ended, else None). ``where``: where to look next (a log)."""

    def __init__(self, engines: list[Engine], deadlines: Deadlines, ended: Callable[[], str | None], where: str,
                 timeout: float | None = None, on_hang: Callable[[], str] | None = None):
        self.engines, self.deadlines, self.ended, self.where = engines, deadlines, ended, where
        self.on_hang = on_hang  # a run that hangs (engines alive): their stacks shown; where
        self.start = self.last_epoch_at = time.monotonic()
        self.timeout = timeout
        self.epochs, self.first, self.checked = 0, None, 0.0
        self.failed_at: dict[str, float] = {}
        self.found_at: float | None = None  # when check() first named a problem (monotonic)

    def epoch(self, done: int, began: float | None = None, seconds: float | None = None) -> None:
        """Rank 0 has reported ``done`` epochs (its lines, as the follower read them), the first
        in ``seconds`` (its own timing); else the first is timed here, from ``began``, when
        its first line came (monotonic; its set-up done, not part of an epoch)."""
        if done > self.epochs:
            now = time.monotonic()
            if self.first is None:
                self.first = seconds if seconds is not None else now - (began or self.start)
            self.epochs, self.last_epoch_at = done, now

    def check(self, client, ar, total: int) -> str | None:
        """The first problem of the run, one line, or None while it goes on."""
        now = time.monotonic()
        problem = self._failed(ar, now) or self._unregistered(client, ar)
        if problem is None and now - self.checked >= self.deadlines.check:
            self.checked = now
            ended = self.ended()
            problem = f"the engines' launcher {ended}" if ended else None
        hang = problem is None and (self._not_started(ar, now) or self._late(ar, now, total))
        if problem or hang:
            self.found_at = self.found_at or now
        if hang and self.on_hang is not None:
            try:
                return self._line(hang, self.on_hang())
            except Exception:  # noqa: BLE001 - the line matters more than the stacks
                pass
        problem = problem or hang
        return self._line(problem) if problem else None

    def _line(self, problem: str, where: str | None = None) -> str:
        return (f"{problem}; the cluster was stopped (engines inside a collective cannot be reused): start a new "
                f"EngineCluster and run again, and see {where or self.where}").replace("\n", " ")

    def _output(self, ar, i: int) -> str:
        out, err = ar.stdout, ar.stderr
        return last_line(out[i] if i < len(out) else "", err[i] if i < len(err) else "")

    def dead(self, ar) -> str | None:
        """Once the run has ended: the first engine the controller declared dead, one line
        (what to do included), or None (every part returned or raised on its own)."""
        problem = self._failed(ar, None, dead_only=True)
        if problem:
            self.found_at = self.found_at or time.monotonic()
        return self._line(problem) if problem else None

    @staticmethod
    def _parts(ar) -> list:
        """(index, msg_id, outcome) of each engine's part: its return value, its exception, or
        PENDING; the first to fail first (by the time of its reply: the engine killed comes
        before the peers its launcher then ends). A part's own future, not the client's
        results, which ipyparallel empties as soon as the part is done."""
        if ar.ready():
            values = list(ar.get(return_exceptions=True))
        elif len(ar.msg_ids) > 1:
            values = [PENDING if not part.done() else part.exception() or part.result() for part in ar.split()]
        else:
            values = [PENDING]
        metadata = ar.metadata if len(ar.msg_ids) > 1 else [ar.metadata]
        when = [str(md.get("completed") or "") for md in metadata]
        return sorted(zip(range(len(values)), ar.msg_ids, values), key=lambda part: when[part[0]] or "~")

    def _failed(self, ar, now: float | None, dead_only: bool = False) -> str | None:
        """An engine that died (the controller's word), or whose part raised while the others
        still run ``FAILED_ALONE`` s later (they wait for it in a collective). Raised on
        every rank alike, the error is the run's result (``EngineCluster.train`` shows it)."""
        from ipyparallel.error import EngineError, RemoteError

        for i, msg_id, error in self._parts(ar):
            if not isinstance(error, Exception):
                continue
            engine = self.engines[i]
            seen = self.failed_at.setdefault(msg_id, time.monotonic())
            if isinstance(error, EngineError) or getattr(error, "ename", "") == "EngineError":
                why = self._dead(engine)
            elif dead_only or (now is not None and now - seen < FAILED_ALONE):
                continue
            elif isinstance(error, RemoteError):
                why = f"failed alone: {error.ename}: {error.evalue}"
            else:
                why = f"failed alone: {type(error).__name__}: {error}"
            return f"{engine.name()} {why}; its last output: {self._output(ar, i)}"
        return None

    def _dead(self, engine: Engine) -> str:
        how = stopped_here(engine)
        return (f"is {how}" if how else "died or stopped answering the controller's heartbeats (killed, frozen, out "
                "of memory, or its node is gone)")

    def _unregistered(self, client, ar) -> str | None:
        """An engine the controller no longer lists (it missed its heartbeats): ipyparallel
        fails its part of the run too, which :meth:`_failed` names; this is the backstop."""
        ids = set(client.ids)
        for i, engine in enumerate(self.engines):
            if engine.eid not in ids:
                return f"{engine.name()} {self._dead(engine)}; its last output: {self._output(ar, i)}"
        return None

    def _not_started(self, ar, now: float) -> str | None:
        if now - self.start < self.deadlines.join:
            return None
        out = ar.stdout
        late = [e for i, e in enumerate(self.engines) if "[engine] rank " not in (out[i] if i < len(out) else "")]
        if not late or self.epochs:
            return None
        names = ", ".join(e.name() for e in late)
        return (f"{names} did not start the run within {self.deadlines.join:g} s of the request (it never reached "
                f"{'them' if len(late) > 1 else 'it'}, or the engine is stuck); rank 0's last output: "
                f"{self._output(ar, 0)}")

    def _late(self, ar, now: float, total: int) -> str | None:
        if self.timeout is not None and now - self.start > self.timeout:
            return f"the training did not finish within {self.timeout:g} s (timeout={self.timeout:g})"
        limit = self.deadlines.epoch_limit(self.first)
        if now - self.last_epoch_at <= limit:
            return None
        what = f"epoch {self.epochs + 1} of {total}" if self.epochs < total else "the run's end after its last epoch"
        d = self.deadlines
        basis = ("deadlines.first_epoch" if self.first is None else
                 f"{d.factor:g} x the first epoch's {_seconds(self.first)} s, at least {d.floor:g} s")
        frozen = [(i, e, how) for i, e in enumerate(self.engines) if (how := stopped_here(e))]
        if frozen:
            i, engine, how = frozen[0]
            return (f"{what} did not end within {limit:.0f} s ({basis}): {engine.name()} is {how}; its last output: "
                    f"{self._output(ar, i)}")
        return (f"{what} did not end within {limit:.0f} s ({basis}) though every engine answers the controller's "
                "heartbeats: a rank waits in a collective another never entered, or an epoch of this run is slower "
                f"(then raise deadlines=Deadlines(...)); rank 0's last output: {self._output(ar, 0)}")
