"""``python -m guide_utils pack-dataset``: a real image dataset as a tar archive, the way
clusters hold ImageNet.

On a cluster the dataset lives as one archive on the parallel filesystem and each job
unpacks it to node-local disk once per node (the thesis's appendices do exactly this with
``ilsvrc2012-torch-resized-new.tar``). To exercise that same path on a laptop or in CI, this
command writes scikit-learn's handwritten digits (1,797 real 8x8 scans, shipped inside
scikit-learn, no download) in the ImageFolder layout the engine reads::

    NAME/train/<class>/<index>.png
    NAME/val/<class>/<index>.png

The train/val split is the one ``--data digits`` uses, so results agree between the two.

    python -m guide_utils pack-dataset digits datasets/digits.tar
"""

from __future__ import annotations

import os
import sys
import tarfile
import tempfile
from pathlib import Path

from ..core.cli import ArgumentParser, one_line_errors
from ..core.errors import GuideError

PROG = "python -m guide_utils pack-dataset"
DATASETS = ("digits",)


def pack_digits(out: Path, name: str = "digits") -> Path:
    """Write the digits as PNG files in the ImageFolder layout into the tar ``out``.

    Refuses to replace an existing file; the archive appears only when complete (written
    under a temporary name in the same directory, then renamed).
    """
    import numpy as np
    from PIL import Image

    from ..data.loaders import build_data

    out = Path(out)
    if out.exists():
        raise GuideError(f"{out} already exists; remove it or choose another output path")
    if not out.parent.is_dir():
        raise GuideError(f"directory {out.parent} does not exist; create it first")
    bundle = build_data("digits")
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".pack-") as tmp:
        root = Path(tmp) / name
        for split, ds in (("train", bundle.train), ("val", bundle.val)):
            x, y = ds.tensors
            for i, (img, label) in enumerate(zip(x.numpy(), y.tolist())):
                folder = root / split / str(label)
                folder.mkdir(parents=True, exist_ok=True)
                # Values were scaled to 0..1 from scikit-learn's 0..16; store as 8-bit grey.
                Image.fromarray(np.rint(img[0] * 255).astype(np.uint8), mode="L").save(folder / f"{i:04d}.png")
        partial = Path(tmp) / "archive.tar"
        with tarfile.open(partial, "w") as tar:
            tar.add(root, arcname=name)
        os.replace(partial, out)
    return out


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("dataset", choices=DATASETS, help="which dataset to pack")
    p.add_argument("output", help="the .tar file to write (never overwritten)")
    p.add_argument("--name", default=None, help="top-level folder inside the archive (default: the dataset name)")
    return p


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = pack_digits(Path(args.output), args.name or args.dataset)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB): {args.name or args.dataset}/train and "
          f"{args.name or args.dataset}/val in the ImageFolder layout")
    return 0


if __name__ == "__main__":
    sys.exit(main())
