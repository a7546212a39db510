"""The engine's datasets as ``tf.data`` pipelines: the same samples and splits as the
PyTorch engine's (``guide_utils.data.loaders.arrays``), sharded per worker under Horovod;
MultiWorkerMirroredStrategy shards the batched dataset itself."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.config import TrainConfig
from ..core.errors import GuideError
from .runtime import TFDist

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class TFData:
    name: str
    train: Any  # tf.data.Dataset of (x, y), unbatched, this worker's shard
    val: Any
    train_size: int  # samples in this worker's training shard
    num_classes: int
    input_shape: tuple[int, ...]


def build_tf_data(cfg: TrainConfig, dist: TFDist) -> TFData:
    import tensorflow as tf

    from ..data.loaders import arrays

    shard = dist.kind == "horovod"  # MWMS shards the batched dataset itself
    if cfg.data == "synthetic":
        # Like tf_cnn_benchmarks without --data_dir: a fixed pool of random images, so the
        # input pipeline costs nothing and the number measures compute and communication.
        g = tf.random.Generator.from_seed(cfg.seed)
        pool = g.normal((64, cfg.image_size, cfg.image_size, 3))
        labels = g.uniform((64,), maxval=1000, dtype=tf.int64)
        size = cfg.synthetic_size // (dist.size if shard else 1)

        def make(n):
            return tf.data.Dataset.range(n).map(lambda i: (pool[i % 64], labels[i % 64]))

        return TFData("synthetic", make(size), make(max(size // 4, 1)), size, 1000,
                      (cfg.image_size, cfg.image_size, 3))
    if cfg.data in ("mnist1d", "digits"):
        xt, yt, xv, yv = arrays(cfg.data, mnist1d_samples=cfg.mnist1d_samples, seed=cfg.seed)
        train, val = tf.data.Dataset.from_tensor_slices((xt, yt)), tf.data.Dataset.from_tensor_slices((xv, yv))
        n = len(yt)
        if shard:
            train, val = train.shard(dist.size, dist.rank), val.shard(dist.size, dist.rank)
            n = len(range(dist.rank, n, dist.size))
        return TFData(cfg.data, train, val, n, int(max(yt.max(), yv.max())) + 1, tuple(xt.shape[1:]))
    root = Path(cfg.data)
    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise GuideError(f"dataset directory {root} has no {split}/ subfolder; the layout is "
                             f"{root}/train/<class>/* and {root}/val/<class>/*, or use --data synthetic, "
                             "mnist1d or digits")
    size = (cfg.image_size, cfg.image_size)
    mean, std = tf.constant(IMAGENET_MEAN), tf.constant(IMAGENET_STD)

    def load(split):
        ds = tf.keras.utils.image_dataset_from_directory(str(root / split), image_size=size, batch_size=None,
                                                         shuffle=False, label_mode="int")
        return ds, len(ds.class_names), int(ds.cardinality())

    train, classes, n = load("train")
    val, _, _ = load("val")
    norm = lambda x, y: ((x / 255.0 - mean) / std, y)  # noqa: E731
    flip = lambda x, y: (tf.image.random_flip_left_right(x), y)  # noqa: E731
    if shard:
        train, val = train.shard(dist.size, dist.rank), val.shard(dist.size, dist.rank)
        n = len(range(dist.rank, n, dist.size))
    return TFData(root.name, train.map(flip).map(norm), val.map(norm), n, classes, (*size, 3))
