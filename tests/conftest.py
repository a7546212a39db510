"""Shared test helpers."""

from __future__ import annotations

from pathlib import Path


def make_image_tree(root: Path, splits=("train", "val"), classes=("cat", "dog"), per_class: int = 3) -> Path:
    """A tiny ImageFolder tree (root/split/class/i.png) of 40x40 RGB images."""
    from PIL import Image

    for split in splits:
        for cls in classes:
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                Image.new("RGB", (40, 40), (i * 80, 30, 200)).save(root / split / cls / f"{i}.png")
    return root

