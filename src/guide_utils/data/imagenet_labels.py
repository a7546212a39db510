"""The class of every ILSVRC2012 validation image, from the label list a user has.

The official validation archive is flat: 50,000 JPEGs and no classes. The classes come
separately, in one of these forms, all read here into ``{"ILSVRC2012_val_00000001": "n01751748", ...}``:

* the development kit, ``ILSVRC2012_devkit_t12.tar.gz``: ``data/ILSVRC2012_validation_ground_truth.txt``
  holds one class *number* per image (line i: image i), and ``data/meta.mat`` maps those
  numbers (ILSVRC2012_ID, 1 to 1000) to synsets. The numbers follow WordNet's order, not
  the sorted synsets, so the ground-truth file alone cannot be used.
* a text file that names an image and its synset on each line: the ``valprep.sh`` script
  many guides use (``mv ILSVRC2012_val_00000001.JPEG n01751748/``), Kaggle's
  ``LOC_val_solution.csv`` (the first synset of each line is the class), or plain
  ``IMAGE SYNSET`` lines. Lines that name no image (a header, ``mkdir`` lines) are skipped.
"""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

from ..core.errors import GuideError

VAL_IMAGE = re.compile(r"ILSVRC2012_val_\d{8}")
SYNSET = re.compile(r"\bn\d{8}\b")
DEVKIT_TRUTH = "ILSVRC2012_validation_ground_truth.txt"
DEVKIT_META = "meta.mat"
FIX = ("pass the devkit archive (ILSVRC2012_devkit_t12.tar.gz) or a list of IMAGE SYNSET lines "
       "(such as valprep.sh or LOC_val_solution.csv)")


def read_val_labels(path: Path) -> dict[str, str]:
    """Image id (``ILSVRC2012_val_NNNNNNNN``) to synset, from a devkit archive or a text list."""
    path = Path(path)
    if not path.is_file():
        raise GuideError(f"val label list {path} not found; {FIX}")
    labels = _from_devkit(path) if tarfile.is_tarfile(path) else _from_text(path.read_text(errors="replace"), path)
    if not labels:
        raise GuideError(f"val label list {path} labels no image; {FIX}")
    return labels


def _from_text(text: str, path: Path) -> dict[str, str]:
    labels: dict[str, str] = {}
    numbers_only = True
    for number, line in enumerate(text.splitlines(), 1):
        numbers_only = numbers_only and (not line.strip() or line.strip().isdigit())
        image, synset = VAL_IMAGE.search(line), SYNSET.search(line)
        if not image:
            continue  # a header, a mkdir line, a comment
        if not synset:
            raise GuideError(f"line {number} of val label list {path} names image {image.group()} but no synset "
                             f"(nXXXXXXXX); {FIX}")
        if labels.setdefault(image.group(), synset.group()) != synset.group():
            raise GuideError(f"val label list {path} gives image {image.group()} two classes "
                             f"({labels[image.group()]} and {synset.group()}); {FIX}")
    if not labels and numbers_only and text.strip():
        raise GuideError(f"val label list {path} holds class numbers only (the devkit's {DEVKIT_TRUTH}), which "
                         "map to synsets through the devkit's meta.mat: pass the devkit archive "
                         "ILSVRC2012_devkit_t12.tar.gz instead")
    return labels


def _from_devkit(path: Path) -> dict[str, str]:
    """Both files of the devkit, read from the archive without unpacking it."""
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(path) as tar:
            for member in tar:
                base = member.name.rsplit("/", 1)[-1]
                if member.isfile() and base in (DEVKIT_TRUTH, DEVKIT_META):
                    files[base] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise GuideError(f"val label list {path} is a damaged archive ({exc}); download the devkit again") from None
    missing = [name for name in (DEVKIT_TRUTH, DEVKIT_META) if name not in files]
    if missing:
        raise GuideError(f"val label list {path} is an archive without data/{' and data/'.join(missing)}; "
                         f"{FIX}")
    synsets = _devkit_synsets(files[DEVKIT_META], path)
    truth = files[DEVKIT_TRUTH].decode(errors="replace").split()
    labels = {}
    for i, number in enumerate(truth, 1):
        if not number.isdigit() or int(number) not in synsets:
            raise GuideError(f"line {i} of {DEVKIT_TRUTH} in {path} is {number!r}, not a class number of "
                             "its meta.mat; download the devkit again")
        labels[f"ILSVRC2012_val_{i:08d}"] = synsets[int(number)]
    return labels


def _devkit_synsets(meta: bytes, path: Path) -> dict[int, str]:
    """ILSVRC2012_ID to synset for the leaf classes of the devkit's meta.mat (the synsets
    with children are WordNet's inner nodes, not classes)."""
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    try:
        table = loadmat(io.BytesIO(meta), squeeze_me=True)["synsets"]
        rows = zip(table["ILSVRC2012_ID"], table["WNID"], table["num_children"])
        return {int(number): str(wnid) for number, wnid, children in rows if int(children) == 0}
    except (KeyError, ValueError, TypeError, MatReadError) as exc:
        raise GuideError(f"meta.mat in {path} has no synsets table ({exc}); download the devkit again") from None
