"""Reading a recorded study back: a CSV whose first line (``# ...``) says what made it,
when, on what; the sweep and the large-batch study share the format and its checks."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from ..core.errors import GuideError


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
