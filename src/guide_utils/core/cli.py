"""What every guide_utils command shares: one-line errors and a strict argument parser.

A user who mistypes a flag or points at a missing file should see one line that names the
problem and the fix, and a non-zero exit status, not a traceback or a screen of usage. A
bug in the guide, on the other hand, must keep its traceback: only the guide's own
:class:`~guide_utils.core.errors.GuideError` and operating-system errors (a missing file, a
permission) become one line. ``--debug`` or ``GUIDE_DEBUG=1`` shows the traceback of
those too.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Callable, NoReturn

from .errors import EXIT_USAGE, GuideError

DEBUG_FLAG = "--debug"


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the flag and pointing at --help;
    every command also takes ``--debug``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_argument(DEBUG_FLAG, action="store_true",
                          help="show the full traceback of an error (also: GUIDE_DEBUG=1)")

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def debugging(argv: list[str] | None = None) -> bool:
    """Whether the user asked for tracebacks (``--debug`` among the arguments, or GUIDE_DEBUG=1)."""
    args = sys.argv[1:] if argv is None else argv
    return DEBUG_FLAG in args or os.environ.get("GUIDE_DEBUG", "") not in ("", "0")


def one_line_errors(prog: str) -> Callable[[Callable[..., int | None]], Callable[..., int]]:
    """Decorate a command's ``main(argv)`` so that the errors a user can fix (GuideError,
    OSError) print as ``PROG: error: ...`` and exit 2. Other exceptions propagate with
    their traceback: they are bugs, and the traceback is what a bug report needs."""

    def decorate(main: Callable[..., int | None]) -> Callable[..., int]:
        @functools.wraps(main)
        def wrapper(argv: list[str] | None = None) -> int:
            try:
                return int(main(argv) or 0)
            except (GuideError, OSError) as exc:
                if debugging(argv):
                    raise
                message = str(exc) if isinstance(exc, GuideError) or not exc.filename else \
                    f"{exc.strerror or exc}: {exc.filename}"
                print(f"{prog}: error: {message}", file=sys.stderr)
                return EXIT_USAGE
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr)
                return 130

        return wrapper

    return decorate
