"""The TensorFlow door: Keras training under Horovod, or under TensorFlow's own
MultiWorkerMirroredStrategy, with the PyTorch engine's settings, run plan and records.

What is shared with the PyTorch engine, not re-implemented: the configuration and its
profiles (``config``), the run plan (``engine.plan``: workers, batches, the scaled learning
rate, steps, the schedule, applied per batch by ``schedules.keras_callback``), the
bookkeeping (``engine.bookkeeping``: record, printed lines, summary, weights digest), the
datasets (``data.loaders.arrays``) and the throughput meter. What is TensorFlow's or
Horovod's own:

* ``--dist horovod``: ``horovod.tensorflow.keras`` with ``DistributedOptimizer`` (gradients
  averaged by allreduce), ``BroadcastGlobalVariablesCallback(0)`` (every worker starts from
  rank 0's weights) and ``MetricAverageCallback`` (reported metrics averaged over workers).
  Start it like the PyTorch engine: horovodrun, mpirun or srun.
* ``--dist mwms``: ``tf.distribute.MultiWorkerMirroredStrategy``; inside a Slurm step the
  cluster comes from ``SlurmClusterResolver`` (one worker per task), elsewhere from
  ``TF_CONFIG``. No MPI and no Horovod build needed; every worker must be started by srun.

The learning rate follows ``lr_at`` exactly, per batch. Horovod's own
``LearningRateWarmupCallback`` is not used for it: it evaluates the ramp one batch ahead
and rescales momentum, so its values differ (see ``schedules.keras_callback``); it also
needs one of Keras's *legacy* optimizers, which is why this door uses
``tf.keras.optimizers.legacy.SGD`` (Horovod 0.28.1 wraps those reliably).

Checkpoints (``--checkpoint-dir``) are written by rank 0 only, after every epoch, and every
worker restores the newest one at start: on a shared filesystem a rerun resumes at the last
finished epoch.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ..core.config import TrainConfig
from ..engine.bookkeeping import RunBook, environment, weights_digest
from ..engine.loop import RunResult
from ..engine.plan import RunPlan
from ..core.errors import GuideError
from .data import build_tf_data
from .models import build_keras_model, check_model_name
from .runtime import check_versions, init, keras_version

PYTORCH_ONLY = (("--amp", lambda c: c.amp != "none"), ("--channels-last", lambda c: c.channels_last),
                ("--compile", lambda c: c.compile), ("--fp16-allreduce", lambda c: c.fp16_allreduce),
                ("--optimizer lars/lamb", lambda c: c.optimizer != "sgd"),
                ("--ddp-bucket-mb", lambda c: c.ddp_bucket_mb is not None),
                ("--fusion-threshold-mb/--cycle-time-ms",
                 lambda c: c.fusion_threshold_mb is not None or c.cycle_time_ms is not None))


def train_tf(cfg: TrainConfig, callbacks: list | None = None) -> RunResult:
    """Train as ``cfg`` says with Keras; returns the PyTorch engine's ``RunResult``.

    ``callbacks`` are added after the guide's own (tests use one to read the learning rate
    of every batch).
    """
    cfg.validate()
    for flag, on in PYTORCH_ONLY:
        if on(cfg):
            raise GuideError(f"{flag} applies to the PyTorch engine only; drop it for python -m guide_utils.train_tf")
    check_model_name(cfg.model)  # before seconds of start-up and data generation
    import tensorflow as tf

    check_versions(tf.__version__, keras_version())
    dist = init(cfg.dist)
    if cfg.checkpoint_dir and dist.kind == "mwms":
        raise GuideError("--checkpoint-dir is not wired for --dist mwms (TensorFlow needs every worker to save); "
                         "use --dist horovod, or tf.keras.callbacks.BackupAndRestore in your own script")
    # The same seed for the data everywhere (MWMS slices every global batch by position, so
    # all workers must shuffle alike); then, under Horovod, different initial weights per
    # worker, which rank 0's broadcast must make equal.
    tf.keras.utils.set_random_seed(cfg.seed)
    data = build_tf_data(cfg, dist)
    local_batch = cfg.per_worker_batch if dist.kind != "mwms" else cfg.per_worker_batch * dist.size
    plan = RunPlan.make(cfg, workers=dist.size, samples_per_worker=data.train_size, data_name=data.name,
                        local_batch=local_batch)
    train_ds, val_ds = _pipelines(cfg, data, dist, local_batch)
    if dist.kind == "horovod":
        tf.random.set_seed(cfg.seed + dist.rank)
    model, optimizer = _model(cfg, plan, data, dist)
    checkpoints = _Checkpoints(cfg, model, optimizer, meta={
        "framework": "tensorflow", "model": cfg.model, "data": data.name, "num_classes": data.num_classes,
        "per_worker_batch": cfg.per_worker_batch, "workers": plan.workers})
    book = RunBook(cfg, plan, framework="tensorflow", prefix="[train_tf]", is_root=dist.is_root,
                   data=f"{data.name}: {data.input_shape} inputs, {data.num_classes} classes",
                   environment=lambda: _environment(dist), run_name=checkpoints.run_name or cfg.run_name,
                   resume=checkpoints.start_epoch > 0,
                   resuming=f", resuming at epoch {checkpoints.start_epoch}" if checkpoints.start_epoch else "")
    if dist.is_root:
        checkpoints.write_meta(book.run_name)
    result = RunResult(run_name=book.run_name, record_path=book.record_path, completed_epochs=checkpoints.start_epoch)
    try:
        if checkpoints.start_epoch < cfg.epochs:
            cbs = [*_callbacks(cfg, plan, dist, book, checkpoints, result.epochs), *(callbacks or [])]
            model.fit(train_ds, epochs=cfg.epochs, initial_epoch=checkpoints.start_epoch,
                      steps_per_epoch=plan.steps_per_epoch, validation_data=val_ds, callbacks=cbs, verbose=0)
            result.completed_epochs = cfg.epochs
        else:
            book.say(f"the checkpoint has already completed {checkpoints.start_epoch} epoch(s), --epochs is "
                     f"{cfg.epochs}: nothing to train (raise --epochs to continue)")
    finally:
        book.close()
    result.weights_digest = weights_digest((w.name, w.numpy()) for w in model.trainable_weights)
    book.finish(completed_epochs=result.completed_epochs, digests=dist.allgather_object(result.weights_digest))
    return result


def _pipelines(cfg: TrainConfig, data, dist, local_batch: int):
    """Shuffled, batched, repeated training data and batched validation data."""
    import tensorflow as tf

    train = (data.train.shuffle(min(data.train_size, 50_000), seed=cfg.seed, reshuffle_each_iteration=True)
             .batch(local_batch, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE))
    val = data.val.batch(local_batch).prefetch(tf.data.AUTOTUNE)
    if dist.kind == "mwms":
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        train, val = train.with_options(opts), val.with_options(opts)
    return train, val


def _model(cfg: TrainConfig, plan: RunPlan, data, dist):
    """The compiled Keras model (inside the strategy's scope for MWMS) and its optimizer."""
    import contextlib

    import tensorflow as tf

    with dist.strategy.scope() if dist.strategy else contextlib.nullcontext():
        model = build_keras_model(cfg.model, num_classes=data.num_classes, input_shape=data.input_shape,
                                  weight_decay=cfg.weight_decay)
        optimizer = tf.keras.optimizers.legacy.SGD(learning_rate=plan.peak_lr, momentum=cfg.momentum)
        if dist.kind == "horovod":
            optimizer = dist.hvd.DistributedOptimizer(optimizer)
        model.compile(optimizer=optimizer,
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name="top1"),
                               tf.keras.metrics.SparseTopKCategoricalAccuracy(k=5, name="top5")])
    return model, optimizer


class _Checkpoints:
    """``tf.train.CheckpointManager`` in ``--checkpoint-dir`` plus a JSON file that says
    which run the checkpoints belong to; restores the newest on every worker."""

    def __init__(self, cfg: TrainConfig, model, optimizer, meta: dict):
        self.cfg, self.meta = cfg, meta
        self.manager, self.start_epoch, self.run_name = None, 0, None
        if not cfg.checkpoint_dir:
            return
        import tensorflow as tf

        directory = Path(cfg.checkpoint_dir)
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=self.epoch)
        self.manager = tf.train.CheckpointManager(ckpt, str(directory), max_to_keep=cfg.keep_checkpoints)
        if self.manager.latest_checkpoint:
            saved = _read_meta(directory / "guide_meta.json")
            different = {k: (saved.get(k), v) for k, v in meta.items() if saved.get(k) != v}
            if different:
                k, (old, new) = next(iter(different.items()))
                raise GuideError(f"{directory} holds a checkpoint of a different run ({k}: {old} there, {new} now); "
                                 "choose another --checkpoint-dir")
            try:
                ckpt.restore(self.manager.latest_checkpoint)  # every worker reads the same file
            except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint gets the same advice
                raise GuideError(f"cannot read checkpoint {self.manager.latest_checkpoint} ({type(exc).__name__}); "
                                 "remove it to start over, or choose another --checkpoint-dir") from None
            self.start_epoch, self.run_name = int(self.epoch.numpy()), saved.get("run_name")

    def write_meta(self, run_name: str | None) -> None:
        if self.manager is None:
            return
        path = Path(self.cfg.checkpoint_dir) / "guide_meta.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**self.meta, "run_name": run_name}))
        os.replace(tmp, path)

    def save(self, epochs_done: int) -> None:
        if self.manager is not None:
            self.epoch.assign(epochs_done)
            self.manager.save(checkpoint_number=epochs_done)


def _read_meta(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        raise GuideError(f"{path} is missing or unreadable, so the checkpoint beside it cannot be checked; "
                         "choose another --checkpoint-dir") from None


def _environment(dist) -> dict[str, Any]:
    import tensorflow as tf

    return environment(dist.kind, dist.size, tensorflow=tf.__version__, keras=keras_version(),
                       gpus=len(tf.config.list_physical_devices("GPU")))


def _callbacks(cfg: TrainConfig, plan: RunPlan, dist, book: RunBook, checkpoints: _Checkpoints,
               rows: list) -> list:
    """Horovod's callbacks (broadcast, metric averaging), the learning-rate schedule, and the
    guide's per-epoch bookkeeping, in the order Horovod prescribes."""
    from ..core.schedules import keras_callback

    cbs: list = []
    if dist.kind == "horovod":
        # Broadcast first, then average metrics before anyone reads them.
        cbs += [dist.hvd.callbacks.BroadcastGlobalVariablesCallback(0), dist.hvd.callbacks.MetricAverageCallback()]
    cbs.append(keras_callback(steps_per_epoch=plan.steps_per_epoch, **plan.schedule))
    cbs.append(_epoch_callback(cfg, plan, dist, book, checkpoints, rows))
    return cbs


def _epoch_callback(cfg: TrainConfig, plan: RunPlan, dist, book: RunBook, checkpoints: _Checkpoints, rows: list):
    """Per epoch: throughput, the record line, the printed line and (rank 0) the checkpoint."""
    import tensorflow as tf

    from ..core.throughput import ThroughputMeter

    class EpochBookkeeping(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()
            self.meter = ThroughputMeter(cfg.per_worker_batch, plan.workers, cfg.throughput_warmup_iters)

        def on_train_batch_end(self, batch, logs=None):
            self.meter.step()

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            rate = self.meter.images_per_second() if self.meter.measured_iters else None
            row = {"epoch": epoch + 1, "lr": logs.get("lr"), "loss": logs.get("loss"),
                   "train_top1_err": 100.0 * (1 - logs["top1"]), "train_top5_err": 100.0 * (1 - logs["top5"]),
                   "val_loss": logs.get("val_loss"), "val_top1_err": 100.0 * (1 - logs["val_top1"]),
                   "val_top5_err": 100.0 * (1 - logs["val_top5"]),
                   "images_per_second": rate, "seconds": time.perf_counter() - self.start}
            rows.append(row)
            if dist.is_root:
                checkpoints.save(epoch + 1)
            book.epoch(row)

    return EpochBookkeeping()
