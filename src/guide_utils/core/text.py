"""Text for a page: long lines folded so that a book's column (about 100 characters of code)
shows them without a scroll bar, for files and commands whose lines are long by nature
(slurm.conf's node lines, sbatch submissions)."""

from __future__ import annotations

import textwrap


def fold(text: str, width: int = 96, indent: str = "    ") -> str:
    """Each line of ``text`` wrapped at spaces to ``width``, continuations indented; words are
    never split (a path stays whole, even when longer than ``width``).

    >>> print(fold("NodeName=gpu01 CPUs=64 RealMemory=500000 Gres=gpu:4", width=30))
    NodeName=gpu01 CPUs=64
        RealMemory=500000
        Gres=gpu:4
    """
    return "\n".join(textwrap.fill(line, width, subsequent_indent=indent, break_long_words=False,
                                   break_on_hyphens=False) if line.strip() else line
                     for line in text.splitlines())
