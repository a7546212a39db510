"""The input-pipeline formats of the tuning chapter, made offline on any machine.

* :func:`make_jpeg_folder`: a real JPEG dataset in the ImageFolder layout, the format the
  thesis's PyTorch runs read (ImageNet's JPEGs, pre-resized to 250x250 and staged to the
  node's SSD). Its images are crops of the two photographs scikit-learn ships
  (``load_sample_images``: a Chinese temple and a flower, 640x427), one class each, saved
  as JPEG, so decoding costs what decoding real photographs costs.
* :func:`write_shards`: the same images decoded once, resized and stored as uint8 arrays in
  a few ``.npy`` shards (the idea behind TFRecord, WebDataset, FFCV and DALI's readers: no
  per-image file and no JPEG decoding in the training loop). The engine reads such a
  directory (it has ``shards.json``) with :class:`DecodedShards`: a random crop and flip of
  the stored image, so augmentation is cheaper and coarser than RandomResizedCrop's.

>>> import tempfile; from pathlib import Path
>>> root = make_jpeg_folder(Path(tempfile.mkdtemp()) / "photos", per_class=4, val_per_class=2, size=96)
>>> sorted(p.name for p in (root / "train").iterdir()), len(list(root.rglob("*.jpg")))
(['china', 'flower'], 12)
>>> shards = write_shards(root, root.parent / "shards", image_size=32)
>>> ds = DecodedShards(shards, "train", crop=32); len(ds), tuple(ds[0][0].shape)
(8, (3, 32, 32))
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from ..core.errors import GuideError

SHARD_IMAGES = 1024
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def make_jpeg_folder(root: Path, *, per_class: int = 256, val_per_class: int = 32, size: int = 256,
                     seed: int = 0, quality: int = 90) -> Path:
    """``root/{train,val}/{china,flower}/<i>.jpg``: random ``size`` x ``size`` crops of
    scikit-learn's two sample photographs. Reuses a complete folder of the same settings."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    root = Path(root)
    stamp = root / ".made"
    settings = json.dumps({"per_class": per_class, "val_per_class": val_per_class, "size": size, "seed": seed,
                           "quality": quality})
    if stamp.exists() and stamp.read_text() == settings:
        return root
    photos = load_sample_images()
    if size > min(min(img.shape[:2]) for img in photos.images):
        raise GuideError(f"crop size {size} is larger than the sample photographs (427 x 640)")
    rng = np.random.default_rng(seed)
    for split, count in (("train", per_class), ("val", val_per_class)):
        for name, img in zip(("china", "flower"), photos.images):
            d = root / split / name
            d.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                y, x = rng.integers(0, img.shape[0] - size + 1), rng.integers(0, img.shape[1] - size + 1)
                crop = img[y:y + size, x:x + size]
                Image.fromarray(crop[:, ::-1] if rng.random() < 0.5 else crop).save(d / f"{i}.jpg", quality=quality)
    stamp.write_text(settings)
    return root


def write_shards(folder: Path, out: Path, *, image_size: int = 72) -> Path:
    """Decode every image of an ImageFolder tree once, resize to ``image_size`` square, and
    store each split as uint8 shards of up to 1024 images plus ``shards.json``."""
    from PIL import Image
    from torchvision import datasets

    folder, out = Path(folder), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"image_size": image_size, "splits": {}}
    for split in ("train", "val"):
        tree = datasets.ImageFolder(str(folder / split))
        meta["classes"] = tree.classes
        names = []
        for start in range(0, len(tree.samples), SHARD_IMAGES):
            chunk = tree.samples[start:start + SHARD_IMAGES]
            images = np.stack([np.asarray(Image.open(p).convert("RGB").resize((image_size, image_size),
                                                                              Image.BILINEAR)) for p, _ in chunk])
            labels = np.array([c for _, c in chunk], dtype=np.int64)
            name = f"{split}-{start // SHARD_IMAGES:05d}"
            np.save(out / f"{name}.images.npy", images)
            np.save(out / f"{name}.labels.npy", labels)
            names.append(name)
        meta["splits"][split] = {"shards": names, "count": len(tree.samples)}
    fd, tmp = tempfile.mkstemp(dir=out, suffix=".json")  # complete or absent
    with os.fdopen(fd, "w") as fh:
        json.dump(meta, fh)
    os.replace(tmp, out / "shards.json")
    return out


def is_shards(path: str | Path) -> bool:
    return (Path(path) / "shards.json").is_file()


class DecodedShards:
    """A split of a shard directory as a map-style dataset of (image tensor, label); training
    items get a random ``crop`` and a horizontal flip, validation items a centre crop.
    Images are normalised float32 CHW tensors, or with ``uint8`` the crop's uint8 CHW pixels
    for the device to normalise (the same values, 4x fewer bytes to collate and copy)."""

    def __init__(self, root: str | Path, split: str, *, crop: int, train: bool | None = None, uint8: bool = False):
        root = Path(root)
        meta = json.loads((root / "shards.json").read_text())
        if crop > meta["image_size"]:
            raise GuideError(f"--image-size {crop} is larger than the shards' stored {meta['image_size']} px; "
                             "write the shards larger (write_shards image_size)")
        names = meta["splits"][split]["shards"]
        self.images = [np.load(root / f"{n}.images.npy", mmap_mode="r") for n in names]
        self.labels = np.concatenate([np.load(root / f"{n}.labels.npy") for n in names])
        self.offsets = np.cumsum([0] + [len(a) for a in self.images])
        self.classes, self.crop, self.size = meta["classes"], crop, meta["image_size"]
        self.train = split == "train" if train is None else train
        self.uint8 = uint8

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, i: int):
        import torch

        shard = int(np.searchsorted(self.offsets, i, side="right") - 1)
        img = self.images[shard][i - self.offsets[shard]]
        if self.train:  # torch's generator: the engine seeds it per item (sampling.SeededItems)
            y, x = (int(v) for v in torch.randint(0, self.size - self.crop + 1, (2,)))
            img = img[y:y + self.crop, x:x + self.crop]
            if torch.rand(()) < 0.5:
                img = img[:, ::-1]
        else:
            o = (self.size - self.crop) // 2
            img = img[o:o + self.crop, o:o + self.crop]
        if self.uint8:
            return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))), int(self.labels[i])
        x = (np.ascontiguousarray(img, dtype=np.float32) / 255.0 - MEAN) / STD
        return torch.from_numpy(x.transpose(2, 0, 1).copy()), int(self.labels[i])
