"""Start a launcher, several workers or a tool on this machine, the way a reader would type it.

The guide's one way to run a command from a notebook or a study: :func:`run` prints the
command (shell-quoted, the environment variables the caller sets shown as a prefix), runs it
in the workers' environment (``local_env.environment``: this environment's ``python`` first on
the PATH, one thread per worker, traffic on loopback), waits, and turns a failure (a non-zero
exit or the timeout) into one line that ends with the tail of the output. With ``records=DIR``
it returns the run records the command wrote there; without, the completed process.

Several processes start at once when ``each`` gives one environment per process (the
``TF_CONFIG`` workers of MultiWorkerMirroredStrategy: :func:`tf_config`), or when ``argv`` is a
list of command lines; the command is then printed as the shell lines that do the same
(``... &`` per process, then ``wait``).

>>> print(shown(["/usr/bin/env", "echo", "a b"], {"GUIDE_SITE": "apptainer-example"}))
GUIDE_SITE=apptainer-example /usr/bin/env echo 'a b'
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

from ..core.errors import GuideError
from ..core.records import RunRecord, read_runs
from .local_env import BIN, environment
from .ports import free_ports

# horovodrun prefixes every line of a worker with its rank: "[1]<stderr>:..."
RANK_PREFIX = re.compile(r"^\[(\d+)\]<std(?:out|err)>:")
ERROR_LINE = re.compile(r"(: error: |\b[A-Z]\w*(Error|Exception): )")
WIDTH = 96  # printed commands wrap here, as the notebooks' text does


def words(argv: Sequence[str]) -> list[str]:
    """``argv`` as a reader types it: this environment's python and its tools by their names."""
    named = {sys.executable: "python", **{str(BIN / n): n for n in ("horovodrun", "torchrun", "python")}}
    return [named.get(str(a), str(a)) for a in argv]


def shown(argv: Sequence[str], env: Mapping[str, str] | None = None, width: int | None = WIDTH,
          aliases: Mapping[Path | str, str] | None = None) -> str:
    """The shell line that runs ``argv`` with ``env`` set, wrapped with ``\\`` at ``width``
    (``None``: one line). ``aliases`` shows a folder by a shell variable's name (a scratch
    folder as ``$RESULTS``), so that the line reads the same on every machine.

    >>> print(shown(["ls", "/scratch/x1/runs"], aliases={"/scratch/x1": "$RESULTS"}))
    ls $RESULTS/runs
    """
    def quoted(word: str) -> str:
        for folder, name in (aliases or {}).items():
            if word == str(folder) or word.startswith(str(folder) + os.sep):
                return name + shlex.quote(word[len(str(folder)):]) if word != str(folder) else name
        return shlex.quote(word)

    tokens = [f"{k}={quoted(str(v))}" for k, v in (env or {}).items()] + [quoted(w) for w in words(argv)]
    lines = [tokens[0]]
    for token in tokens[1:]:
        if width and len(lines[-1].rsplit("\n", 1)[-1]) + len(token.split("\n", 1)[0]) + 3 > width:
            lines.append("    " + token)
        else:
            lines[-1] += " " + token
    return " \\\n".join(lines)


def tf_config(workers: int, host: str = "localhost") -> list[dict[str, str]]:
    """One ``TF_CONFIG`` per worker of a MultiWorkerMirroredStrategy cluster on this machine,
    for ``run(..., each=tf_config(n))``: every worker lists all of them on free ports, and
    knows its own index (worker 0 is the chief). The JSON breaks its line before ``"task"``
    (JSON allows it) so that a printed command fits a page."""
    cluster = json.dumps({"worker": [f"{host}:{port}" for port in free_ports(workers)]})
    return [{"TF_CONFIG": f'{{"cluster": {cluster},\n "task": {{"type": "worker", "index": {i}}}}}'}
            for i in range(workers)]


def _name(argv: Sequence[str]) -> str:
    """What the error message calls a command: ``horovodrun``, ``python -m guide_utils``, ``python x.py``."""
    w = words(argv)
    if w[0] == "python" and len(w) > 2 and w[1] == "-m":  # horovodrun minus its build check reads as itself
        return "horovodrun" if w[2].endswith(".runtime.horovodrun") else f"python -m {w[2]}"
    if w[0] == "python" and len(w) > 1:
        return f"python {Path(w[1]).name}"
    return Path(w[0]).name


def _tail(stdout: str, stderr: str, lines: int = 3, chars: int = 400) -> str:
    """The last lines of the error output (else of the output) as one line."""
    text = [ln.strip() for ln in (stderr.strip() or stdout.strip()).splitlines() if ln.strip()]
    # A launcher's own summary (torchrun's "error_file: <N/A> ...") can bury the worker's
    # error: put the last error line ("prog: error: ...", "ValueError: ...") first.
    reason = [ln for ln in text[:-lines] if ERROR_LINE.search(ln)][-1:]
    tail = " | ".join(reason + text[-lines:]) or "no output"
    return tail if len(tail) <= chars else "..." + tail[-chars:]


def _stop(proc: subprocess.Popen) -> None:
    """End ``proc`` and whatever it started (a launcher's workers run in its session)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _echo(stdout: str, prefix: str) -> None:
    """Print rank 0's lines that start with ``prefix``, without horovodrun's rank prefix."""
    for line in stdout.splitlines():
        rank = RANK_PREFIX.match(line)
        if rank and rank.group(1) != "0":
            continue
        text = line[rank.end():] if rank else line
        if text.startswith(prefix):
            print(text, flush=True)


def _output(proc: subprocess.Popen) -> tuple[str, str]:
    """What ``proc`` wrote so far: (stdout, stderr)."""
    texts = []
    for f in proc.files:
        f.seek(0)
        texts.append(f.read().decode(errors="replace"))
    return texts[0], texts[1]


def _wait(procs: list[subprocess.Popen], names: list[str], timeout: float) -> list[tuple[str, str]]:
    """Wait for every process; the first failure (or the deadline) stops the others and raises."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
        if failed is not None or (None in codes and time.monotonic() > deadline):
            for p in procs:
                _stop(p)
        if failed is not None:
            raise GuideError(f"{names[failed]} exited {codes[failed]}: {_tail(*_output(procs[failed]))}")
        if None not in codes:
            return [_output(p) for p in procs]
        if time.monotonic() > deadline:
            tail = " | ".join(_tail(*_output(p), lines=3 if len(procs) == 1 else 1) for p in procs)
            raise GuideError(f"{names[0]} did not finish in {timeout:.0f} s and was stopped; last output: "
                             f"{tail} (give it more time with timeout=, or less work)")
        time.sleep(0.1)


def _new_records(records: Path, before: dict[Path, int]) -> list[RunRecord]:
    runs = [r for r in read_runs(records) if before.get(Path(r.path)) != Path(r.path).stat().st_mtime_ns]
    if not runs:
        raise GuideError(f"the command finished but wrote no run record in {records}; "
                         "pass it --results-dir with that folder")
    return runs


def run(argv: Sequence[str] | Sequence[Sequence[str]], *, env: Mapping[str, str] | None = None,
        each: Sequence[Mapping[str, str]] | None = None, records: Path | str | None = None,
        timeout: float = 900, cwd: Path | str | None = None, echo: str | None = None, show: bool = True,
        aliases: Mapping[Path | str, str] | None = None, dry_run: bool = False):
    """Print and run ``argv`` (or one process per command line of a list, or per environment of
    ``each``) with ``env`` on top of the workers' environment; wait for all of them.

    Returns the run records the processes wrote to ``records`` (new or extended ones), else the
    ``subprocess.CompletedProcess`` (a list of them for several processes). ``echo``: print
    rank 0's output lines that start with it (``""``: all). A non-zero exit of any process, or
    ``timeout`` seconds passing, stops them all and raises one line with the output's tail.
    ``aliases``: folders the printed command names by a variable (see :func:`shown`).
    ``dry_run``: print the command, run nothing, return None.
    """
    argvs = [list(map(str, a)) for a in argv] if argv and not isinstance(argv[0], str) else [list(map(str, argv))]
    if each is not None and len(argvs) == 1:
        argvs = argvs * len(each)
    extras = [dict(e) for e in each] if each is not None else [{} for _ in argvs]
    if len(extras) != len(argvs):
        raise GuideError(f"{len(argvs)} command lines but {len(extras)} environments in each=; give one per process")
    several = len(argvs) > 1
    if show:
        lines = [shown(a, {**(env or {}), **e}, aliases=aliases) + (" &" if several else "")
                 for a, e in zip(argvs, extras)]
        print("\n".join(f"$ {line}" for line in lines + (["wait"] if several else [])), flush=True)
    if dry_run:
        return None
    names = [f"{_name(a)}{f' (process {i + 1} of {len(argvs)})' if several else ''}" for i, a in enumerate(argvs)]
    base = {**environment(), **(env or {})}
    before = {p: p.stat().st_mtime_ns for p in Path(records).glob("*.jsonl")} if records else {}
    procs = []
    try:
        for a, extra in zip(argvs, extras):
            files = (tempfile.TemporaryFile(), tempfile.TemporaryFile())  # no pipe a busy worker can fill
            try:  # its own session: _stop ends a launcher together with its workers
                proc = subprocess.Popen(a, env={**base, **extra}, cwd=cwd, stdout=files[0], stderr=files[1],
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            except FileNotFoundError:
                for f in files:
                    f.close()
                raise GuideError(f"{words(a)[0]} not found; install it or put it on the PATH") from None
            proc.files = files
            procs.append(proc)
        outputs = _wait(procs, names, timeout)
    finally:  # an interrupted cell leaves no worker behind
        for p in procs:
            _stop(p)
            for f in p.files:
                f.close()
    if echo is not None:
        _echo(outputs[0][0], echo)
    if records:
        return _new_records(Path(records), before)
    done = [subprocess.CompletedProcess(a, 0, out, err) for a, (out, err) in zip(argvs, outputs)]
    return done if several else done[0]
