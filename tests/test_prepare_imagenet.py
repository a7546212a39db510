"""prepare-imagenet on small archives in the two shapes of the official downloads: a train
tar of class tars, a flat validation tar with its labels apart (the devkit, or a list of
IMAGE SYNSET lines). The result is one archive in the layout staging unpacks and the
engine reads; a rerun after an interruption resumes; bad input is one line and harms nothing."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from guide_utils.data import imagenet
from guide_utils.data.imagenet import Sources, main, prepare

# Three classes; the devkit numbers them in WordNet's order, not the sorted one.
DEVKIT_IDS = {1: "n00000003", 2: "n00000001", 3: "n00000002"}
CLASSES = sorted(DEVKIT_IDS.values())
TRAIN_PER_CLASS, VAL_PER_CLASS = 3, 2
EXPECT = ["--expect", str(TRAIN_PER_CLASS * len(CLASSES)), str(VAL_PER_CLASS * len(CLASSES))]
ERROR = "python -m guide_utils prepare-imagenet: error: "


def _jpeg(seed: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return out.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _tar(path: Path, files: dict[str, bytes], mode: str = "w") -> Path:
    with tarfile.open(path, mode) as tar:
        for name, data in files.items():
            _add(tar, name, data)
    return path


def _val_truth() -> dict[str, str]:
    """Image id to synset: the classes interleaved, as in the real validation set."""
    return {f"ILSVRC2012_val_{i + 1:08d}": CLASSES[i % len(CLASSES)] for i in range(VAL_PER_CLASS * len(CLASSES))}


def _devkit(path: Path) -> Path:
    """data/ILSVRC2012_validation_ground_truth.txt (class numbers) and data/meta.mat (numbers
    to synsets, with one inner WordNet node that is no class)."""
    from scipy.io import savemat

    fields = [("ILSVRC2012_ID", "O"), ("WNID", "O"), ("words", "O"), ("num_children", "O")]
    rows = [(n, w, f"class {w}", 0) for n, w in DEVKIT_IDS.items()] + [(4, "n09999999", "an inner node", 3)]
    meta = io.BytesIO()
    savemat(meta, {"synsets": np.array(rows, dtype=fields).reshape(-1, 1)})
    number = {w: n for n, w in DEVKIT_IDS.items()}
    truth = "".join(f"{number[w]}\n" for w in _val_truth().values())
    return _tar(path, {"ILSVRC2012_devkit_t12/data/meta.mat": meta.getvalue(),
                       "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt": truth.encode()}, "w:gz")


@pytest.fixture(scope="module")
def downloads(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("downloads")
    class_tars = {}
    for c, synset in enumerate(CLASSES):
        images = {f"{synset}_{i}.JPEG": _jpeg(100 * c + i) for i in range(TRAIN_PER_CLASS)}
        class_tars[f"{synset}.tar"] = _tar(d / f"{synset}.tar", images).read_bytes()
    truth = _val_truth()
    valprep = "".join(f"mkdir -p {s}\n" for s in CLASSES) + "".join(f"mv {i}.JPEG {s}/\n" for i, s in truth.items())
    (d / "valprep.sh").write_text(valprep)
    return {"train": _tar(d / "ILSVRC2012_img_train.tar", class_tars),
            "val": _tar(d / "ILSVRC2012_img_val.tar", {f"{i}.JPEG": _jpeg(10_000 + n) for n, i in enumerate(truth)}),
            "devkit": _devkit(d / "ILSVRC2012_devkit_t12.tar.gz"), "valprep": d / "valprep.sh"}


def _args(downloads: dict[str, Path], out: Path, label_list: str = "devkit", **paths: Path) -> list[str]:
    given = {"train": downloads["train"], "val": downloads["val"], "labels": downloads[label_list], **paths}
    return [str(out), "--train", str(given["train"]), "--val", str(given["val"]), "--val-labels",
            str(given["labels"]), "--no-progress", *EXPECT]


def _one_error(capsys, code: int) -> str:
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(ERROR), err
    return err.strip()[len(ERROR):]


def test_the_archive_has_the_layout_staging_unpacks_and_the_engine_reads(downloads, tmp_path):
    out = tmp_path / "ilsvrc2012.tar"
    proc = subprocess.run([sys.executable, "-m", "guide_utils", "prepare-imagenet", *_args(downloads, out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"{out.name} (" in proc.stdout and "ilsvrc2012/train (9 images, 3 classes)" in proc.stdout
    assert f"GUIDE_DATASET_ARCHIVE={out} GUIDE_DATASET_NAME=ilsvrc2012" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # no partial files left
    subprocess.run(["tar", "-xf", str(out), "-C", str(tmp_path)], check=True)  # as staging does
    root = tmp_path / "ilsvrc2012"
    for split, per_class in (("train", TRAIN_PER_CLASS), ("val", VAL_PER_CLASS)):
        assert sorted(p.name for p in (root / split).iterdir()) == CLASSES
        assert all(len(list((root / split / c).glob("*.JPEG"))) == per_class for c in CLASSES)
    # Each validation image in the class the devkit's numbers name, byte for byte.
    with tarfile.open(downloads["val"]) as val:
        for image, synset in _val_truth().items():
            original = val.extractfile(f"{image}.JPEG").read()
            assert (root / "val" / synset / f"{image}.JPEG").read_bytes() == original
    from guide_utils.data.loaders import build_data

    bundle = build_data(str(root), image_size=8)
    assert (len(bundle.train), len(bundle.val), bundle.num_classes) == (9, 6, 3)


def test_a_valprep_list_gives_the_same_archive_as_the_devkit(downloads, tmp_path):
    names = {}
    for labels in ("devkit", "valprep"):
        out = tmp_path / f"{labels}.tar"
        assert main(_args(downloads, out, labels)) == 0
        with tarfile.open(out) as tar:
            names[labels] = tar.getnames()
    assert names["devkit"] == names["valprep"] and len(names["devkit"]) == 3 + 2 * len(CLASSES) + 9 + 6


def test_a_rerun_resumes_after_the_classes_already_written(downloads, tmp_path, monkeypatch, capsys):
    """Interrupted in the second class (half of it written): the rerun cuts the partial
    archive back to the end of the first, says what it skips, and writes each image once."""
    out = tmp_path / "ilsvrc2012.tar"
    write_class = imagenet._write_class
    calls = []

    def interrupted(out_tar, tar, synset, member, *args):
        calls.append(synset)
        if len(calls) == 2:
            _add(out_tar, f"ilsvrc2012/train/{synset}/half-written.JPEG", b"x" * 1000)
            raise KeyboardInterrupt
        return write_class(out_tar, tar, synset, member, *args)

    monkeypatch.setattr(imagenet, "_write_class", interrupted)
    assert main(_args(downloads, out)) == 130
    assert "interrupted" in capsys.readouterr().err and not out.exists()
    monkeypatch.setattr(imagenet, "_write_class", write_class)
    assert main(_args(downloads, out)) == 0
    assert f"resuming {out}.partial: val done, 1 of 3 train classes done (skipped)" in capsys.readouterr().out
    with tarfile.open(out) as tar:
        names = tar.getnames()
    assert len(names) == len(set(names)) and not any("half-written" in n for n in names)
    assert sum(n.endswith(".JPEG") for n in names) == 9 + 6


def test_the_official_counts_are_checked_by_default(downloads, tmp_path, capsys):
    out = tmp_path / "ilsvrc2012.tar"
    args = _args(downloads, out)[:-3]  # without --expect
    message = _one_error(capsys, main(args))
    assert message == (f"val archive {downloads['val']} holds 6 images, expected 50,000 (the official ILSVRC2012 "
                       "count): an incomplete download? Download it again, or pass --expect 1281167 6 with your "
                       "subset's counts")
    assert list(tmp_path.iterdir()) == []
    # The train count is known at the end: the archive stays partial, and a rerun with the
    # right counts finishes it without copying again.
    message = _one_error(capsys, main([*args, "--expect", "1281167", "6"]))
    assert message.startswith(f"train archive {downloads['train']} holds 9 images, expected 1,281,167")
    assert "pass --expect 9 6" in message and not out.exists()
    assert main(_args(downloads, out)) == 0
    assert "resuming" in capsys.readouterr().out and out.exists()


def _swap(d):  # the two archives given the wrong way round
    return {"train": d["val"], "val": d["train"]}


@pytest.mark.parametrize("case, given, expected", [
    ("no train archive", lambda d, t: {"train": t / "missing.tar"},
     "train archive {tmp}/missing.tar not found; pass ILSVRC2012_img_train.tar"),
    ("val given as train", lambda d, t: _swap(d), "train archive {val} is not a tar of class tars: it holds "
     "ILSVRC2012_val_00000001.JPEG, not nXXXXXXXX.tar"),
    ("not a tar", lambda d, t: {"val": d["valprep"]}, "val archive {valprep} is not a tar archive; pass "
     "ILSVRC2012_img_val.tar, the flat tar of 50,000 JPEGs"),
    ("train given as val", lambda d, t: {"val": d["train"]},
     "val archive {train} holds class tars (n00000001.tar): that is the train archive"),
    ("an image without label", lambda d, t: {"labels": _text(t, 1, lambda s: s)},
     "val label list {tmp}/labels.txt has no class for 1 of the 6 images of {val} (e.g. ILSVRC2012_val_00000001)"),
    ("labels of other classes", lambda d, t: {"labels": _text(t, 0, lambda s: s.replace("n0000000", "n1234567"))},
     "val label list {tmp}/labels.txt and train archive {train} have different classes (n12345671 only in val"),
    ("class numbers alone", lambda d, t: {"labels": _numbers(t)},
     "val label list {tmp}/truth.txt holds class numbers only (the devkit's ILSVRC2012_validation_ground_truth.txt)"),
])
def test_bad_input_is_one_line_that_names_the_problem_and_the_fix(downloads, tmp_path, capsys, case, given, expected):
    out = tmp_path / "ilsvrc2012.tar"
    paths = {k: str(v) for k, v in downloads.items()}
    message = _one_error(capsys, main(_args(downloads, out, **given(downloads, tmp_path))))
    assert message.startswith(expected.format(tmp=tmp_path, **paths)), message
    assert not out.exists() and not list(tmp_path.glob("*.partial*"))


def _text(tmp: Path, skip: int, edit) -> Path:
    lines = [f"{image}.JPEG {edit(synset)}" for image, synset in _val_truth().items()][skip:]
    (tmp / "labels.txt").write_text("\n".join(lines) + "\n")
    return tmp / "labels.txt"


def _numbers(tmp: Path) -> Path:
    (tmp / "truth.txt").write_text("2\n3\n1\n2\n3\n1\n")
    return tmp / "truth.txt"


def test_the_users_files_are_never_overwritten(downloads, tmp_path, capsys):
    out = tmp_path / "ilsvrc2012.tar"
    out.write_text("precious")
    message = _one_error(capsys, main(_args(downloads, out)))
    assert message == f"{out} already exists and is never overwritten; remove it or choose another OUTPUT"
    assert out.read_text() == "precious"
    out.unlink()
    partial = tmp_path / "ilsvrc2012.tar.partial"
    partial.write_text("also precious")
    message = _one_error(capsys, main(_args(downloads, out)))
    assert message == (f"{partial} exists and is not this command's (no ilsvrc2012.tar.partial.json); move it away "
                       "or choose another OUTPUT")
    assert partial.read_text() == "also precious"


def test_a_partial_archive_of_other_inputs_is_not_resumed(downloads, tmp_path, monkeypatch, capsys):
    out = tmp_path / "ilsvrc2012.tar"
    monkeypatch.setattr(imagenet, "_write_class", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(_args(downloads, out)) == 130
    assert capsys.readouterr().err.strip() == "python -m guide_utils prepare-imagenet: interrupted"
    monkeypatch.undo()
    message = _one_error(capsys, main([*_args(downloads, out, "valprep"), "--name", "imagenet"]))
    assert message.startswith(f"{out}.partial was started from other archives or another --name")
    assert (tmp_path / "ilsvrc2012.tar.partial").exists()


def test_prepare_returns_the_images_of_every_class(downloads, tmp_path):
    done = prepare(Sources(downloads["train"], downloads["val"], downloads["valprep"]), tmp_path / "x.tar",
                   expect=(9, 6), progress=False, say=lambda line: None)
    assert done == {"val": 6, **{c: 3 for c in CLASSES}}
