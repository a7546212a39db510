"""Shared test helpers and the one book build of a test session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def make_image_tree(root: Path, splits=("train", "val"), classes=("cat", "dog"), per_class: int = 3) -> Path:
    """A tiny ImageFolder tree (root/split/class/i.png) of 40x40 RGB images."""
    from PIL import Image

    for split in splits:
        for cls in classes:
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                Image.new("RGB", (40, 40), (i * 80, 30, 200)).save(root / split / cls / f"{i}.png")
    return root


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> Path:
    """The whole book, built once per session exactly as `make book` builds it (every notebook
    executed once), into a temporary directory; its ``_build`` folder. Every test that needs
    an executed notebook reads it from the build's execution cache (``test_book.executed``),
    and the HTML from ``_build/html``: no notebook runs twice."""
    out = tmp_path_factory.mktemp("book")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "book.py"), "--path-output", str(out)],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        reports = out / "_build" / "html" / "reports"
        pytest.fail(f"the book build failed ({proc.returncode}); reports: {reports if reports.exists() else 'none'}\n"
                    f"{(proc.stdout + proc.stderr)[-6000:]}")
    print(proc.stdout[-3000:])  # the per-notebook execution times, shown with -s or on failure
    return out / "_build"
