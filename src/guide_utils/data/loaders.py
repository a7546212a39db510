"""Datasets by name: synthetic ImageNet-shaped tensors, MNIST-1D, or an ImageFolder tree.

* ``synthetic-loader`` (``synthetic`` is the same): random ImageNet-shaped images fed
  through the DataLoader like real data, so it measures compute, communication *and* the
  input path (batch assembly in the loader workers, pinning, the copy to the device), but no
  JPEG decoding. Items come from a small pre-generated pool, and item ``i`` is the same on
  every rank and run.
* ``synthetic-resident``: one batch generated on the device once and reused every step, the
  method of Horovod's ``pytorch_synthetic_benchmark.py`` and tf_cnn_benchmarks without
  ``--data_dir``: what the device computes when nothing has to feed it. The engine builds
  that batch (``engine.feed.ResidentBatches``); here it is the same dataset as the loader
  mode, for the plan's sample counts and for validation.
* ``mnist1d``: MNIST-1D (Greydanus, "Scaling down deep learning", 2020), a small real
  classification problem with enough samples for the large-batch effects to show on a CPU.
  It is *generated* (never downloaded) and cached as an .npz file.
* ``digits``: scikit-learn's handwritten digits (1,797 real 8x8 images, shipped inside the
  scikit-learn package): a real image-classification set that works offline, for the 2-D
  models on a CPU. Too small for the large-batch experiments (only a few steps per epoch
  at large batches); those use MNIST-1D.
* a directory: ``DIR/train/<class>/*`` and ``DIR/val/<class>/*`` with the thesis's
  transforms (Appendix 5), the layout of the PyTorch-examples ImageNet script; or a
  directory of pre-decoded uint8 shards with ``shards.json`` (``guide_utils.data.datasets``).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from ..core.errors import GuideError

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass
class DataBundle:
    name: str
    train: Dataset
    val: Dataset
    num_classes: int
    input_shape: tuple[int, ...]
    synthetic: bool = False
    # the items are uint8 images that the engine converts to float32 and normalises with
    # these (mean, std) on the device (``--input-dtype uint8``); None: items are ready floats
    normalize: tuple[list[float], list[float]] | None = None
    resident: bool = False  # synthetic-resident: the engine reuses one batch made on the device


SYNTHETIC_MODES = {"synthetic": "synthetic-loader", "synthetic-loader": "synthetic-loader",
                   "synthetic-resident": "synthetic-resident"}
INPUT_DTYPES = ("auto", "float32", "uint8")


class SyntheticImages(Dataset):
    """``size`` ImageNet-shaped samples drawn from a pool of 64 fixed random images.

    float32: standard-normal pixels (already "normalised"). uint8: pixels uniform in 0..255,
    to be normalised on the device like real images; 4x fewer bytes through the loader.
    """

    POOL = 64

    def __init__(self, size: int, image_size: int, num_classes: int, seed: int, *, uint8: bool = False):
        g = torch.Generator().manual_seed(seed)
        shape = (self.POOL, 3, image_size, image_size)
        self.images = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8) if uint8 \
            else torch.randn(*shape, generator=g)
        self.labels = torch.randint(0, num_classes, (size,), generator=g)
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        return self.images[i % self.POOL], self.labels[i]


def _cache_dir(cache_dir: Path | None) -> Path:
    return Path(cache_dir or os.environ.get("GUIDE_DATA_CACHE") or Path.home() / ".cache" / "guide_utils")


def _mnist1d_arrays(samples: int, seed: int, cache_dir: Path | None) -> dict[str, np.ndarray]:
    from importlib.metadata import version

    # Keyed by the installed mnist1d, which is imported only to generate: importing it
    # (matplotlib, scipy) costs each worker a CPU-second that a cache hit does not need.
    key = hashlib.sha256(f"{samples}-{seed}-{version('mnist1d')}".encode()).hexdigest()[:12]
    directory = _cache_dir(cache_dir)
    path = directory / f"mnist1d-{samples}-seed{seed}-{key}.npz"
    want = ("x", "y", "x_test", "y_test")
    if path.exists():
        try:
            with np.load(path) as f:
                arrays = {k: f[k] for k in want}
            if arrays["x"].shape[1:] == (40,) and len(arrays["x"]) == len(arrays["y"]):
                return arrays
        except Exception:  # noqa: BLE001 - any unreadable cache is regenerated
            pass
        warnings.warn(f"MNIST-1D cache {path} is unreadable; generating it again", stacklevel=3)
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = samples, seed
    # make_dataset prints progress; keep rank output clean.
    stdout, sys.stdout = sys.stdout, open(os.devnull, "w")
    try:
        data = make_dataset(args)
    finally:
        sys.stdout.close()
        sys.stdout = stdout
    arrays = {k: np.asarray(data[k]) for k in want}
    directory.mkdir(parents=True, exist_ok=True)
    # Atomic: several ranks may generate at once; each renames a complete file into place.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".mnist1d-", suffix=".npz")
    with os.fdopen(fd, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)
    return arrays


def _tensors(x: np.ndarray, y: np.ndarray) -> TensorDataset:
    return TensorDataset(torch.as_tensor(x, dtype=torch.float32).unsqueeze(1), torch.as_tensor(y, dtype=torch.int64))


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: (1797, 8, 8) images with pixel values 0..16, and their labels;
    the arrays ``load_digits`` returns, read from the CSV file scikit-learn ships. Importing
    scikit-learn's datasets costs about 3 CPU-seconds, which every process that trains on
    digits would pay (the tests start hundreds)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    csv = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if csv is None or not csv.is_file():  # another layout: scikit-learn's own reader
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.images, d.target
    data = np.loadtxt(csv, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def _digits() -> DataBundle:
    images, target = digits_arrays()
    x = torch.as_tensor(images / 16.0, dtype=torch.float32).unsqueeze(1)  # pixel values are 0..16
    y = torch.as_tensor(target, dtype=torch.int64)
    # A fixed split (not the run's seed): every run validates on the same 20%.
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    n_val = len(y) // 5
    val, train = order[:n_val], order[n_val:]
    return DataBundle("digits", TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val]), 10, (1, 8, 8))


def _image_folder(root: Path, image_size: int, uint8: bool = False) -> DataBundle:
    from torchvision import datasets, transforms

    if not root.exists():
        raise GuideError(f"dataset directory {root} does not exist; pass --data DIR with DIR/train and DIR/val, "
                         "or --data synthetic, mnist1d or digits")
    if not root.is_dir():
        raise GuideError(f"--data {root} is not a directory; the ImageFolder layout is DIR/train/<class>/* and "
                         "DIR/val/<class>/*")
    splits = {}
    for split in ("train", "val"):
        d = root / split
        if not d.is_dir():
            hint = " (the thesis's valprep step sorts validation images into class folders)" if split == "val" else ""
            raise GuideError(f"dataset directory {root} has no {split}/ subfolder{hint}; the layout is "
                             f"{root}/train/<class>/* and {root}/val/<class>/*")
        classes = sorted(p.name for p in d.iterdir() if p.is_dir())
        images = any(f.suffix.lower() in IMAGE_SUFFIXES for c in classes for f in (d / c).iterdir())
        if not classes or not images:
            raise GuideError(f"{d} has no class folders with images; expected {d}/<class>/<image>.jpeg")
        splits[split] = classes
    if splits["train"] != splits["val"]:
        only = sorted(set(splits["train"]) ^ set(splits["val"]))[:3]
        raise GuideError(f"{root}/train and {root}/val have different classes (e.g. {', '.join(only)}); "
                         "both need the same class folders")
    # uint8: the tensor of the PIL image as it is; the device converts and normalises it
    # (engine.feed) exactly as ToTensor and Normalize would have in the worker.
    tail = [transforms.PILToTensor()] if uint8 else \
        [transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    train_tf = transforms.Compose([transforms.RandomResizedCrop(image_size), transforms.RandomHorizontalFlip(), *tail])
    val_tf = transforms.Compose([transforms.Resize(int(image_size * 256 / 224)), transforms.CenterCrop(image_size),
                                 *tail])
    train = datasets.ImageFolder(str(root / "train"), transform=train_tf)
    val = datasets.ImageFolder(str(root / "val"), transform=val_tf)
    return DataBundle(root.name, train, val, len(train.classes), (3, image_size, image_size),
                      normalize=(IMAGENET_MEAN, IMAGENET_STD) if uint8 else None)


def arrays(spec: str, *, mnist1d_samples: int = 20000, seed: int = 0, cache_dir: Path | None = None):
    """The built-in real datasets as numpy arrays in channels-last layout, for frameworks
    other than PyTorch (the TensorFlow door): ``(x_train, y_train, x_val, y_val)``.

    Same samples and the same train/val split as ``build_data``: MNIST-1D as (N, 40, 1)
    signals, digits as (N, 8, 8, 1) images scaled to 0..1.
    """
    if spec == "mnist1d":
        if mnist1d_samples < 100:
            raise GuideError(f"--mnist1d-samples must be at least 100, got {mnist1d_samples}")
        a = _mnist1d_arrays(mnist1d_samples, seed, cache_dir)
        return (a["x"][..., None].astype(np.float32), a["y"].astype(np.int64),
                a["x_test"][..., None].astype(np.float32), a["y_test"].astype(np.int64))
    if spec == "digits":
        b = _digits()
        (xt, yt), (xv, yv) = b.train.tensors, b.val.tensors
        return (xt.permute(0, 2, 3, 1).numpy(), yt.numpy(), xv.permute(0, 2, 3, 1).numpy(), yv.numpy())
    raise GuideError(f"no array form of dataset {spec!r}; choose mnist1d or digits")


def build_data(spec: str, *, image_size: int = 224, num_classes: int = 1000, synthetic_size: int = 1024,
               mnist1d_samples: int = 20000, seed: int = 0, cache_dir: Path | None = None,
               input_dtype: str = "float32") -> DataBundle:
    """The datasets named by ``spec``: ``synthetic`` (``-loader``, ``-resident``), ``mnist1d``,
    ``digits`` or an ImageFolder directory. ``input_dtype`` uint8: image items stay uint8 for
    the device to normalise (``bundle.normalize``); the 1-D and digits sets are floats only."""
    if input_dtype not in ("float32", "uint8"):
        raise GuideError(f"--input-dtype must be auto, float32 or uint8, got {input_dtype!r}")
    uint8 = input_dtype == "uint8"
    if spec in SYNTHETIC_MODES:
        if synthetic_size <= 0:
            raise GuideError(f"--synthetic-size must be positive, got {synthetic_size}")
        resident = SYNTHETIC_MODES[spec] == "synthetic-resident"
        uint8 = uint8 and not resident  # the resident batch is made on the device, as floats
        # The loader mode keeps the name "synthetic": the recorded runs and checkpoints use it.
        return DataBundle("synthetic-resident" if resident else "synthetic",
                          SyntheticImages(synthetic_size, image_size, num_classes, seed, uint8=uint8),
                          SyntheticImages(max(synthetic_size // 4, 1), image_size, num_classes, seed + 1, uint8=uint8),
                          num_classes, (3, image_size, image_size), synthetic=True, resident=resident,
                          normalize=(IMAGENET_MEAN, IMAGENET_STD) if uint8 else None)
    if uint8 and spec in ("mnist1d", "digits"):
        raise GuideError(f"--input-dtype uint8 is for images (synthetic, a folder, shards); {spec} is "
                         "float data: use --input-dtype auto or float32")
    if spec == "mnist1d":
        if mnist1d_samples < 100:
            raise GuideError(f"--mnist1d-samples must be at least 100, got {mnist1d_samples}")
        a = _mnist1d_arrays(mnist1d_samples, seed, cache_dir)
        return DataBundle("mnist1d", _tensors(a["x"], a["y"]), _tensors(a["x_test"], a["y_test"]),
                          int(max(a["y"].max(), a["y_test"].max())) + 1, (1, a["x"].shape[1]))
    if spec == "digits":
        return _digits()
    from .datasets import DecodedShards, is_shards

    if is_shards(spec):  # pre-decoded uint8 shards (guide_utils.data.datasets.write_shards)
        train = DecodedShards(spec, "train", crop=image_size, uint8=uint8)
        val = DecodedShards(spec, "val", crop=image_size, uint8=uint8)
        return DataBundle(Path(spec).name, train, val, len(train.classes), (3, image_size, image_size),
                          normalize=(IMAGENET_MEAN, IMAGENET_STD) if uint8 else None)
    return _image_folder(Path(spec), image_size, uint8)


def describe(bundle: DataBundle) -> str:
    shape = ", ".join(map(str, bundle.input_shape))
    feed = ", uint8 normalised on the device" if bundle.normalize else ""
    return (f"{bundle.name}: {len(bundle.train)} train / {len(bundle.val)} val samples, "
            f"{bundle.num_classes} classes, input ({shape}){feed}")


def resolve_input_dtype(setting: str, spec: str, device_type: str) -> str:
    """``--input-dtype auto``: uint8 for image data on a GPU (4x fewer bytes to assemble,
    pin and copy; normalised there), float32 elsewhere (a CPU gains nothing, and the CPU
    results stay what they were)."""
    if setting != "auto":
        return setting
    images = spec in SYNTHETIC_MODES or spec not in ("mnist1d", "digits")
    return "uint8" if device_type == "cuda" and images else "float32"
