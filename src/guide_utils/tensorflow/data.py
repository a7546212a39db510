"""The engine's datasets for ``tf.data``: the same samples and splits as the PyTorch
engine's (``guide_utils.data.arrays``), sharded per worker under Horovod;
MultiWorkerMirroredStrategy shards the batched dataset itself.

Training samples are read by position (``TFData.read``), as the PyTorch engine's sampler reads
them: the engine draws each epoch's order from the seed and the epoch alone (a resumed run
sees what an unbroken one does), and augmentation is seeded per sample and epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..core.config import TrainConfig
from ..core.errors import GuideError
from .runtime import TFDist

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class TFData:
    name: str
    positions: Any  # int64 tensor: this worker's training samples (its shard under Horovod)
    read: Callable[[Any], Any]  # a tf.data.Dataset of (position, stateless seed [2]) -> one of samples (x, y)
    val: Any  # tf.data.Dataset of (x, y), unbatched, this worker's shard
    num_classes: int
    input_shape: tuple[int, ...]

    @property
    def train_size(self) -> int:
        """Samples in this worker's training shard."""
        return int(self.positions.shape[0])


def build_tf_data(cfg: TrainConfig, dist: TFDist) -> TFData:
    import tensorflow as tf

    from ..data.arrays import SYNTHETIC_MODES, arrays

    shard = dist.kind == "horovod"  # MWMS shards the batched dataset itself
    if cfg.data in SYNTHETIC_MODES:
        # Like tf_cnn_benchmarks without --data_dir: a fixed pool of random images, so the
        # input pipeline costs nothing and the number measures compute and communication
        # (every synthetic mode of the PyTorch engine is this one here).
        g = tf.random.Generator.from_seed(cfg.seed)
        pool = g.normal((64, cfg.image_size, cfg.image_size, 3))
        labels = g.uniform((64,), maxval=1000, dtype=tf.int64)
        size = cfg.synthetic_size // (dist.size if shard else 1)
        val = tf.data.Dataset.range(max(size // 4, 1)).map(lambda i: (pool[i % 64], labels[i % 64]))
        return TFData("synthetic", tf.range(size, dtype=tf.int64),
                      lambda ds: ds.map(lambda i, seed: (pool[i % 64], labels[i % 64]),
                                        num_parallel_calls=tf.data.AUTOTUNE),
                      val, 1000, (cfg.image_size, cfg.image_size, 3))
    if cfg.data in ("mnist1d", "digits"):
        xt, yt, xv, yv = arrays(cfg.data, mnist1d_samples=cfg.mnist1d_samples, seed=cfg.seed)
        x, y = tf.constant(xt), tf.constant(yt)
        val = tf.data.Dataset.from_tensor_slices((xv, yv))
        positions = tf.range(len(yt), dtype=tf.int64)
        if shard:
            val, positions = val.shard(dist.size, dist.rank), positions[dist.rank::dist.size]
        # A lookup per sample costs ten times one per 256 samples: read in-memory arrays in blocks.
        return TFData(cfg.data, positions,
                      lambda ds: ds.batch(256).map(lambda i, seed: (tf.gather(x, i), tf.gather(y, i))).unbatch(),
                      val, int(max(yt.max(), yv.max())) + 1, tuple(xt.shape[1:]))
    return _image_folder(cfg, dist, shard)


def _image_folder(cfg: TrainConfig, dist: TFDist, shard: bool) -> TFData:
    """An ImageFolder tree (root/train/<class>/*, root/val/<class>/*): training images read by
    path as Keras's ``image_dataset_from_directory`` reads them, flipped at random."""
    import tensorflow as tf

    root = Path(cfg.data)
    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise GuideError(f"dataset directory {root} has no {split}/ subfolder; the layout is "
                             f"{root}/train/<class>/* and {root}/val/<class>/*, or use --data synthetic, "
                             "mnist1d or digits")
    size = (cfg.image_size, cfg.image_size)
    mean, std = tf.constant(IMAGENET_MEAN), tf.constant(IMAGENET_STD)

    def listed(split):
        return tf.keras.utils.image_dataset_from_directory(str(root / split), image_size=size, batch_size=None,
                                                           shuffle=False, label_mode="int")

    train, val = listed("train"), listed("val")
    # Keras labels a file by its class folder (the first folder below train/), in sorted order.
    index = {name: k for k, name in enumerate(train.class_names)}
    paths = tf.constant(train.file_paths)
    labels = tf.constant([index[Path(p).relative_to(root / "train").parts[0]] for p in train.file_paths],
                         dtype=tf.int32)

    def load(i, seed):
        image = tf.io.decode_image(tf.io.read_file(paths[i]), channels=3, expand_animations=False)
        image = tf.image.resize(image, size)  # bilinear, as Keras's loader
        image.set_shape((*size, 3))
        image = tf.image.stateless_random_flip_left_right(image, seed)
        return (image / 255.0 - mean) / std, labels[i]

    positions = tf.range(len(train.file_paths), dtype=tf.int64)
    if shard:
        val, positions = val.shard(dist.size, dist.rank), positions[dist.rank::dist.size]
    return TFData(root.name, positions, lambda ds: ds.map(load, num_parallel_calls=tf.data.AUTOTUNE),
                  val.map(lambda x, y: ((x / 255.0 - mean) / std, y)),
                  len(train.class_names), (*size, 3))
