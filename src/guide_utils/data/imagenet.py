"""``python -m guide_utils prepare-imagenet``: the official ILSVRC2012 downloads as the one
archive the sbatch examples stage (``GUIDE_DATASET_ARCHIVE``).

The downloads are not in the layout the engine reads:

* ``ILSVRC2012_img_train.tar`` holds 1000 tars, one per class (``n01440764.tar``), each a
  flat tar of that class's JPEGs;
* ``ILSVRC2012_img_val.tar`` holds 50,000 JPEGs in one flat tar; their classes come in a
  separate list (:mod:`guide_utils.data.imagenet_labels` reads the forms there are).

This command reads both once, front to back, and writes their images into one tar::

    NAME/train/<synset>/<image>.JPEG    1,281,167 images in 1000 classes
    NAME/val/<synset>/<image>.JPEG      50,000 images

which guide.sh's staging unpacks on every node and ``--data`` reads. Nothing is unpacked
on the way: a million small files on a parallel file system is what inode quotas and
metadata servers suffer from, and what staging exists to avoid. It is resumable: the
archive grows as ``OUTPUT.partial``, and after each class the position and the classes
done are saved (``OUTPUT.partial.json``); a rerun with the same archives cuts the partial
archive back to that position, skips the classes done and says so. It is checked: every
validation image has a label and every label an image, train and val have the same
classes, and the totals are the official ones (or those of ``--expect``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import tarfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

from ..core.cli import ArgumentParser, one_line_errors
from ..core.errors import GuideError
from .imagenet_labels import FIX as LABELS_FIX
from .imagenet_labels import VAL_IMAGE, read_val_labels

PROG = "python -m guide_utils prepare-imagenet"
OFFICIAL = (1_281_167, 50_000)  # train and validation images of ILSVRC2012
CLASS_TAR = re.compile(r"(n\d{8})\.tar")
TRAIN_FIX = "pass ILSVRC2012_img_train.tar, the tar of 1000 class tars (n01440764.tar, ...)"
VAL_FIX = "pass ILSVRC2012_img_val.tar, the flat tar of 50,000 JPEGs"
EXAMPLE = f"""example (the downloads from image-net.org, on the cluster's project disk):
  {PROG} /scratch/$PROJECT/ilsvrc2012.tar --train ILSVRC2012_img_train.tar \\
      --val ILSVRC2012_img_val.tar --val-labels ILSVRC2012_devkit_t12.tar.gz
then, in the site profile: GUIDE_DATASET_ARCHIVE=/scratch/$PROJECT/ilsvrc2012.tar GUIDE_DATASET_NAME=ilsvrc2012"""


@dataclass(frozen=True)
class Sources:
    train: Path
    val: Path
    labels: Path

    def identity(self, name: str) -> dict:
        """What a partial archive was started from: a rerun resumes only from the same."""
        return {"name": name, **{what: {"path": str(p.resolve()), "bytes": p.stat().st_size,
                                        "mtime_ns": p.stat().st_mtime_ns}
                                 for what, p in (("train", self.train), ("val", self.val), ("labels", self.labels))}}


@contextlib.contextmanager
def _reading(path: Path, what: str, fix: str) -> Iterator[None]:
    """A damaged or truncated archive is one line naming it, wherever tarfile notices."""
    try:
        yield
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        why = " ".join(str(exc).split())  # tarfile's messages may span lines
        raise GuideError(f"{what} {path} is damaged or incomplete ({why}); download it again, or {fix}") from None


def _open(path: Path, what: str, fix: str) -> tarfile.TarFile:
    if not path.is_file():
        raise GuideError(f"{what} {path} not found; {fix}")
    if not tarfile.is_tarfile(path):
        raise GuideError(f"{what} {path} is not a tar archive; {fix}")
    with _reading(path, what, fix):
        return tarfile.open(path)  # any compression, though the official archives have none


def class_tars(tar: tarfile.TarFile, path: Path) -> dict[str, tarfile.TarInfo]:
    """Synset to its class tar, in archive order. Reads the headers only: tarfile seeks past
    each class's data."""
    classes = {}
    with _reading(path, "train archive", TRAIN_FIX):
        for member in tar:
            if member.isdir():
                continue
            match = CLASS_TAR.fullmatch(PurePosixPath(member.name).name)
            if not member.isfile() or not match:
                raise GuideError(f"train archive {path} is not a tar of class tars: it holds {member.name}, not "
                                 f"nXXXXXXXX.tar; {TRAIN_FIX}")
            classes[match.group(1)] = member
    if not classes:
        raise GuideError(f"train archive {path} holds no class tars; {TRAIN_FIX}")
    return classes


def val_images(tar: tarfile.TarFile, path: Path) -> list[tuple[str, tarfile.TarInfo]]:
    """(image id, member) of every validation image, in archive order."""
    images = []
    with _reading(path, "val archive", VAL_FIX):
        for member in tar:
            if member.isdir():
                continue
            name = PurePosixPath(member.name)
            image = VAL_IMAGE.fullmatch(name.stem)
            if CLASS_TAR.fullmatch(name.name):
                raise GuideError(f"val archive {path} holds class tars ({name.name}): that is the train archive; "
                                 f"{VAL_FIX}")
            if not member.isfile() or not image:
                raise GuideError(f"val archive {path} holds {member.name}, not a validation image "
                                 f"(ILSVRC2012_val_NNNNNNNN.JPEG); {VAL_FIX}")
            if len(name.parts) > 1:
                raise GuideError(f"val archive {path} is sorted into folders already ({member.name}); {VAL_FIX}")
            images.append((image.group(), member))
    return images


def check_val(images: list[tuple[str, tarfile.TarInfo]], labels: dict[str, str], classes: set[str],
              sources: Sources) -> None:
    """Every image labelled, every label an image, the same classes as train."""
    ids = [i for i, _ in images]
    if len(set(ids)) != len(ids):
        raise GuideError(f"val archive {sources.val} holds an image twice; {VAL_FIX}")
    unlabelled, extra = sorted(set(ids) - labels.keys()), sorted(labels.keys() - set(ids))
    where = f"val label list {sources.labels}"
    if unlabelled:
        raise GuideError(f"{where} has no class for {len(unlabelled):,} of the {len(ids):,} images of "
                         f"{sources.val} (e.g. {unlabelled[0]}): the list of another archive? {LABELS_FIX}")
    if extra:
        raise GuideError(f"{where} labels {len(extra):,} images that {sources.val} does not hold (e.g. {extra[0]}): "
                         f"the list of another archive? {LABELS_FIX}")
    val_classes = set(labels.values())
    if val_classes != classes:
        only_val, only_train = sorted(val_classes - classes), sorted(classes - val_classes)
        example = f"{only_val[0]} only in val" if only_val else f"{only_train[0]} only in train"
        raise GuideError(f"{where} and train archive {sources.train} have different classes ({example}; "
                         f"{len(val_classes)} and {len(classes)} classes): the labels of another dataset? "
                         f"{LABELS_FIX}")


def _count(what: str, path: Path, got: int, expected: int, other: str) -> None:
    if got != expected:
        raise GuideError(f"{what} archive {path} holds {got:,} images, expected {expected:,} (the official "
                         f"ILSVRC2012 count): an incomplete download? Download it again, or pass --expect "
                         f"{other} with your subset's counts")


def _size(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


class Partial:
    """OUTPUT.partial and OUTPUT.partial.json: the archive so far, and where it may resume."""

    def __init__(self, out: Path, identity: dict):
        self.out, self.identity = out, identity
        self.path = out.with_name(out.name + ".partial")
        self.state_path = out.with_name(out.name + ".partial.json")
        self.state = {"sources": identity, "offset": 0, "done": {}}

    def open(self, needed: int):
        """The partial archive, positioned where the last complete class ended."""
        if self.state_path.exists() and self.path.exists():
            state = json.loads(self.state_path.read_text())
            if state.get("sources") != self.identity:
                raise GuideError(f"{self.path} was started from other archives or another --name; rerun with those "
                                 f"to resume, or remove {self.path} and {self.state_path} to start over")
            if self.path.stat().st_size < state["offset"]:
                raise GuideError(f"{self.path} is shorter than {self.state_path.name} records; remove both to "
                                 "start over")
            self.state = state
        elif self.path.exists():
            raise GuideError(f"{self.path} exists and is not this command's (no {self.state_path.name}); move it "
                             "away or choose another OUTPUT")
        free = shutil.disk_usage(self.path.parent).free
        if free < needed - self.state["offset"]:
            raise GuideError(f"{self.path.parent} has {_size(free)} free, the archive needs about "
                             f"{_size(needed - self.state['offset'])} more (the train and val archives' size); "
                             "free space there or write OUTPUT elsewhere")
        f = open(self.path, "r+b" if self.state["offset"] else "wb")
        f.truncate(self.state["offset"])  # what followed the last saved class is incomplete
        f.seek(self.state["offset"])
        self.save(f)
        return f

    def save(self, f) -> None:
        """Record the position after a complete unit, once its bytes are on disk."""
        f.flush()
        os.fsync(f.fileno())
        self.state["offset"] = f.tell()
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.state_path)

    def unit(self, f, name: str, write: Callable[[tarfile.TarFile], int]) -> None:
        """Write one unit (val, or a class) and record it. A TarFile per unit, each starting
        where the last one ended: tarfile keeps every member it wrote in memory, which for
        1.3 million images would be gigabytes."""
        self.state["done"][name] = write(tarfile.open(fileobj=f, mode="w"))
        self.save(f)

    def finish(self, f) -> None:
        """The end-of-archive blocks, then the archive under its own name."""
        tarfile.open(fileobj=f, mode="w").close()
        f.truncate()
        f.flush()
        os.fsync(f.fileno())
        f.close()
        if self.out.exists():
            raise GuideError(f"{self.out} appeared while this ran; it is left alone, the result is {self.path}")
        os.replace(self.path, self.out)
        self.state_path.unlink()


def _folder(tar: tarfile.TarFile, path: str, mtime: float) -> None:
    info = tarfile.TarInfo(path)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
    tar.addfile(info)


def _copy(tar: tarfile.TarFile, path: str, member: tarfile.TarInfo, data) -> None:
    """One image, streamed from its source archive; owner and mode are the unpacker's."""
    info = tarfile.TarInfo(path)
    info.size, info.mtime, info.mode = member.size, member.mtime, 0o644
    tar.addfile(info, data)


def _write_val(out: tarfile.TarFile, tar: tarfile.TarFile, images, labels: dict[str, str], name: str,
               sources: Sources, bar) -> int:
    now = time.time()
    for folder in (name, f"{name}/train", f"{name}/val", *(f"{name}/val/{s}" for s in sorted(set(labels.values())))):
        _folder(out, folder, now)
    with _reading(sources.val, "val archive", VAL_FIX):
        for image, member in images:
            _copy(out, f"{name}/val/{labels[image]}/{PurePosixPath(member.name).name}", member,
                  tar.extractfile(member))
            bar.update()
    return len(images)


def _write_class(out: tarfile.TarFile, tar: tarfile.TarFile, synset: str, member: tarfile.TarInfo, name: str,
                 sources: Sources, bar) -> int:
    _folder(out, f"{name}/train/{synset}", member.mtime)
    count = 0
    with _reading(sources.train, f"class tar {member.name} in train archive", TRAIN_FIX):
        with tarfile.open(fileobj=tar.extractfile(member), mode="r|") as inner:  # read front to back, once
            for image in inner:
                if image.isdir():
                    continue
                if not image.isfile():
                    raise GuideError(f"class tar {member.name} in train archive {sources.train} holds {image.name}, "
                                     f"not an image file; {TRAIN_FIX}")
                _copy(out, f"{name}/train/{synset}/{PurePosixPath(image.name).name}", image, inner.extractfile(image))
                count += 1
                bar.update()
    if not count:
        raise GuideError(f"class tar {member.name} in train archive {sources.train} holds no images; download it "
                         "again")
    return count


def _check_output(out: Path, name: str) -> None:
    if out.exists():
        raise GuideError(f"{out} already exists and is never overwritten; remove it or choose another OUTPUT")
    if not out.parent.is_dir():
        raise GuideError(f"folder {out.parent} does not exist; create it first")
    if not name or "/" in name or name in (".", ".."):
        raise GuideError(f"--name {name!r} must be one folder name, e.g. ilsvrc2012 (GUIDE_DATASET_NAME)")


def prepare(sources: Sources, out: Path, *, name: str = "ilsvrc2012", expect: tuple[int, int] = OFFICIAL,
            progress: bool = True, say: Callable[[str], None] = print) -> dict[str, int]:
    """Write ``out`` from the official archives (see the module doc); images per unit:
    ``{"val": 50000, "n01440764": 1300, ...}``."""
    from tqdm import tqdm

    out = Path(out)
    _check_output(out, name)
    labels = read_val_labels(sources.labels)
    with _open(sources.train, "train archive", TRAIN_FIX) as train, _open(sources.val, "val archive", VAL_FIX) as val:
        classes, images = class_tars(train, sources.train), val_images(val, sources.val)
        check_val(images, labels, set(classes), sources)
        _count("val", sources.val, len(images), expect[1], f"{expect[0]} {len(images)}")
        partial = Partial(out, sources.identity(name))
        f = partial.open(needed=sources.train.stat().st_size + sources.val.stat().st_size)
        done = partial.state["done"]
        if done:
            say(f"resuming {partial.path}: val {'done' if 'val' in done else 'to do'}, "
                f"{sum(s in done for s in classes)} of {len(classes)} train classes done (skipped)")
        with f, tqdm(total=sum(expect), initial=sum(done.values()), unit=" images", disable=None if progress else True,
                     desc=out.name, mininterval=1) as bar:
            if "val" not in done:
                partial.unit(f, "val", lambda tar: _write_val(tar, val, images, labels, name, sources, bar))
            for i, (synset, member) in enumerate(classes.items(), 1):
                if synset not in done:
                    partial.unit(f, synset, lambda tar: _write_class(tar, train, synset, member, name, sources, bar))
                if progress and bar.disable and i % 100 == 0:  # no terminal (a batch job's log): a line now and then
                    say(f"{i} of {len(classes)} train classes written")
            train_images = sum(n for unit, n in done.items() if unit != "val")
            _count("train", sources.train, train_images, expect[0], f"{train_images} {expect[1]}")
            partial.finish(f)
    return dict(done)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].replace("``", ""), epilog=EXAMPLE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output", type=Path, help="the .tar to write; never overwritten (OUTPUT.partial while it grows)")
    p.add_argument("--train", type=Path, required=True, help="ILSVRC2012_img_train.tar: a tar of 1000 class tars")
    p.add_argument("--val", type=Path, required=True, help="ILSVRC2012_img_val.tar: 50,000 JPEGs, no folders")
    p.add_argument("--val-labels", type=Path, required=True,
                   help="the class of each validation image: the devkit ILSVRC2012_devkit_t12.tar.gz, or a list of "
                        "IMAGE SYNSET lines (valprep.sh, LOC_val_solution.csv)")
    p.add_argument("--name", default="ilsvrc2012", help="the top folder in the archive, GUIDE_DATASET_NAME "
                                                        "(default: ilsvrc2012)")
    p.add_argument("--expect", type=int, nargs=2, metavar=("TRAIN", "VAL"), default=OFFICIAL,
                   help=f"image counts to check (default: the official {OFFICIAL[0]} {OFFICIAL[1]}); a subset: its own")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return p


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sources = Sources(args.train, args.val, args.val_labels)
    done = prepare(sources, args.output, name=args.name, expect=tuple(args.expect), progress=args.progress)
    train = sum(n for unit, n in done.items() if unit != "val")
    print(f"wrote {args.output} ({_size(args.output.stat().st_size)}): {args.name}/train ({train:,} images, "
          f"{len(done) - 1} classes) and {args.name}/val ({done['val']:,} images)")
    print(f"in the site profile: GUIDE_DATASET_ARCHIVE={args.output.resolve()} GUIDE_DATASET_NAME={args.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
