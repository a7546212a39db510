"""A study's CSV: its first line (``# ...``) says what made it, when, on what machine, with
which thread counts, commit and versions; rows are appended as runs finish and never
overwritten; reading it back checks that it is one. A session that resumes the file (to
finish it, or to add seeds) writes its own such line before its first row, so every row
lies under the line that says what made it.

Every study (the sweep, the large-batch study, ``verify``'s retrained points) writes and
reads this one format through :class:`~guide_utils.studies.study.Study`. Its provenance line
is built by ``results.provenance``, the one builder of both record formats (this CSV line,
and the JSON object that starts ``perf``'s recorded measurements).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from ..core.errors import GuideError
from ..results import provenance as _provenance
from ..results.provenance import commit, cpu_isa  # noqa: F401 - the study's names for them (verify prints the ISA)


def provenance(title: str, command: str, *, threads: Sequence[int], jobs: int) -> str:
    """A study CSV's first line: what made it, when, on what, how, from which commit and stack
    (``results.provenance``, which builds the JSON records' first line too)."""
    return _provenance.line(title, command, threads=threads, jobs=jobs)


class Sink:
    """The CSV a study appends to: created with its provenance line, never overwritten; with
    ``resume`` an existing one is read back and the runs it holds are not trained again."""

    def __init__(self, path: str | Path, columns: Sequence[str], header: str, *, key: Sequence[str],
                 resume: bool = False):
        self.path, self.columns, self.key_columns = Path(path), list(columns), list(key)
        self.done: set[tuple] = set()
        self.pending = None  # a resumed file's new provenance line, written before the session's first row
        if self.path.exists():
            if not resume:
                raise GuideError(f"{self.path} already exists; choose another --out, or add --resume to "
                                 "finish it (results are never overwritten)")
            self._read_back()
            self.pending = header
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("x", encoding="utf-8") as fh:
                fh.write(f"# {header}\n{','.join(self.columns)}\n")

    def _read_back(self) -> None:
        import csv

        with self.path.open(encoding="utf-8") as fh:
            fh.readline()
            reader = csv.DictReader(line for line in fh if not line.startswith("#"))
            if reader.fieldnames != self.columns:
                raise GuideError(f"{self.path} has other columns than this study writes; it cannot be resumed "
                                 "(choose another --out)")
            self.done = {self.key(row) for row in reader}

    def key(self, row: dict) -> tuple:
        """What identifies a run (its point, seed and thread count), alike for a row read back
        from the CSV and one just trained (values compare as the CSV writes them)."""
        return tuple(str(row[c]) for c in self.key_columns)

    def write(self, row: dict) -> None:
        with self.path.open("a", encoding="utf-8") as fh:
            if self.pending is not None:
                fh.write(f"# {self.pending}\n")
                self.pending = None
            fh.write(",".join("" if row[c] is None else str(row[c]) for c in self.columns) + "\n")
        self.done.add(self.key(row))


def read(path: str | Path, *, what: str, command: str, columns: Iterable[str], dtype: dict | None = None):
    """The table of ``path`` with ``.attrs['source']`` = its first line and ``.attrs['sources']``
    = every provenance line (the first, then one per resumed session). ``what`` names the
    study in messages ("sweep"), ``command`` is the one that writes such a file; a missing,
    unreadable or foreign file is one :class:`GuideError` that says how to make a good one."""
    import io

    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise GuideError(f"no {what} results at {path}; run `{command} --out {path}` first")
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True) or [""]
    sources = [line.lstrip("# ").strip() for line in lines[:1] + [x for x in lines[1:] if x.startswith("#")]]
    try:
        table = pd.read_csv(io.StringIO("".join(x for x in lines[1:] if not x.startswith("#"))), dtype=dtype)
    except Exception as exc:  # noqa: BLE001 - any parse failure is one message
        raise GuideError(f"{path} is not a {what} CSV ({exc}); rerun `{command}`") from None
    missing = set(columns) - set(table.columns)
    if missing:
        raise GuideError(f"{path} lacks column(s) {', '.join(sorted(missing))}; it was not written by `{command}`")
    table.attrs["source"], table.attrs["sources"] = sources[0], sources
    return table


def measured(table) -> str:
    """When and on what a study's rows were measured, one clause per session that trained some
    (its provenance lines' "measured DATE on MACHINE"), for a figure's title."""
    import re

    dates: dict[str, list[str]] = {}
    for line in table.attrs.get("sources") or [table.attrs.get("source", "")]:
        found = re.search(r"measured (\S+) on ([^;]+)", line)
        if found:
            dates.setdefault(found.group(2), []).append(found.group(1))
    return "; ".join(f"measured {' and '.join(dict.fromkeys(d))} on {machine}" for machine, d in dates.items())
