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

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from ..core.errors import GuideError
from .arrays import SYNTHETIC_MODES, digits_split, mnist1d_arrays

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


def _tensors(x: np.ndarray, y: np.ndarray) -> TensorDataset:
    return TensorDataset(torch.as_tensor(x, dtype=torch.float32).unsqueeze(1), torch.as_tensor(y, dtype=torch.int64))


def _digits() -> DataBundle:
    x, y, train, val = (torch.as_tensor(a) for a in digits_split())
    x = x.unsqueeze(1)
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
        a = mnist1d_arrays(mnist1d_samples, seed, cache_dir)
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
