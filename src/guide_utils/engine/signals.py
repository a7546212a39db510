"""Slurm's stop signals, caught from the first moment of a run.

``sbatch --signal=B:USR1@600`` warns a job before its time limit; the training answers by
saving a checkpoint. Python's default for SIGUSR1 is to die, and importing torch takes
seconds, so a warning that arrives during start-up would kill the run before its real
handler exists. ``catch_early`` installs a recording handler first thing; the training
loop asks ``take_early_signal`` when it takes over.
"""

from __future__ import annotations

import contextlib
import signal

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_received: int | None = None


def _record(signum, _frame) -> None:
    global _received
    _received = signum


def catch_early() -> None:
    """Record SIGTERM/SIGUSR1 instead of dying (main thread only; elsewhere a no-op)."""
    with contextlib.suppress(ValueError):
        for sig in SIGNALS:
            signal.signal(sig, _record)


def take_early_signal() -> int | None:
    """The stop signal received since ``catch_early``, if any; asking clears it."""
    global _received
    signum, _received = _received, None
    return signum


class StopFlag:
    """Set by SIGTERM/SIGUSR1 (what Slurm sends before the time limit with --signal), for
    the duration of a ``with`` block; a signal caught by :func:`catch_early` during
    start-up counts too, so the run stops at its first step."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopFlag":
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        self.signum = take_early_signal()
        return self

    def _handle(self, signum, _frame) -> None:
        self.signum = signum

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
