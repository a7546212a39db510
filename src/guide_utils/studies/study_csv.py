"""A study's CSV: its first line (``# ...``) says what made it, when, on what machine, with
which thread counts, commit and versions; rows are appended as runs finish and never
overwritten; reading it back checks that it is one.

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
        if self.path.exists():
            if not resume:
                raise GuideError(f"{self.path} already exists; choose another --out, or add --resume to "
                                 "finish it (results are never overwritten)")
            self._read_back()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("x", encoding="utf-8") as fh:
                fh.write(f"# {header}\n{','.join(self.columns)}\n")

    def _read_back(self) -> None:
        import csv

        with self.path.open(encoding="utf-8") as fh:
            fh.readline()
            reader = csv.DictReader(fh)
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
            fh.write(",".join("" if row[c] is None else str(row[c]) for c in self.columns) + "\n")
        self.done.add(self.key(row))


def read(path: str | Path, *, what: str, command: str, columns: Iterable[str], dtype: dict | None = None):
    """The table of ``path`` with ``.attrs['source']`` = its first line. ``what`` names the
    study in messages ("sweep"), ``command`` is the one that writes such a file; a missing,
    unreadable or foreign file is one :class:`GuideError` that says how to make a good one."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise GuideError(f"no {what} results at {path}; run `{command} --out {path}` first")
    with path.open(encoding="utf-8") as fh:
        source = fh.readline().lstrip("# ").strip()
        try:
            table = pd.read_csv(fh, dtype=dtype)
        except Exception as exc:  # noqa: BLE001 - any parse failure is one message
            raise GuideError(f"{path} is not a {what} CSV ({exc}); rerun `{command}`") from None
    missing = set(columns) - set(table.columns)
    if missing:
        raise GuideError(f"{path} lacks column(s) {', '.join(sorted(missing))}; it was not written by `{command}`")
    table.attrs["source"] = source
    return table
