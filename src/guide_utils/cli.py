"""What every guide_utils command shares: one-line errors and a strict argument parser.

A user who mistypes a flag or points at a missing file should see one line that names the
problem and the fix, and a non-zero exit status, not a traceback or a screen of usage.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Callable, NoReturn

# Exit status for bad input (argparse's own convention); 1 is left for "ran and failed".
EXIT_USAGE = 2


class GuideError(Exception):
    """A problem the user can fix; its message says what and how."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the flag and pointing at --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def one_line_errors(prog: str) -> Callable[[Callable[..., int | None]], Callable[..., int]]:
    """Decorate a command's ``main`` so that the errors a user can fix (GuideError,
    ValueError, FileNotFoundError, PermissionError) print as ``PROG: error: ...`` and exit 2."""

    def decorate(main: Callable[..., int | None]) -> Callable[..., int]:
        @functools.wraps(main)
        def wrapper(*args, **kwargs) -> int:
            try:
                return int(main(*args, **kwargs) or 0)
            except (GuideError, ValueError, FileNotFoundError, PermissionError) as exc:
                print(f"{prog}: error: {exc}", file=sys.stderr)
                return EXIT_USAGE
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr)
                return 130

        return wrapper

    return decorate
