"""The guide's own error type and exit statuses.

A :class:`GuideError` is a problem the user can fix: its message names the problem and the
fix, and the commands print it as one line. Anything else that escapes a command is a bug
and keeps its traceback.
"""

from __future__ import annotations

# Exit status for bad input (argparse's own convention); 1 is left for "ran and failed".
EXIT_USAGE = 2


class GuideError(Exception):
    """A problem the user can fix; its message says what and how."""
