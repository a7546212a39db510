"""The TensorFlow door: Keras training under Horovod, or under TensorFlow's own
MultiWorkerMirroredStrategy, with the PyTorch engine's settings, run plan and records.

What is shared with the PyTorch engine, not re-implemented: the configuration and its
profiles (``config``), the run plan (``engine.plan``: workers, batches, the scaled learning
rate, steps, the schedule, applied per batch by ``schedules.keras_callback``), the
bookkeeping (``engine.bookkeeping``: record, printed lines, summary, weights digest), the
datasets (``data.arrays.arrays``) and the throughput meter. What is TensorFlow's or
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

Checkpoints (``--checkpoint-dir``) are written after every epoch, and every worker restores
the newest one at start: on a shared filesystem a rerun resumes at the last finished epoch and
continues its run record. Under Horovod rank 0 writes them; under MWMS every worker must take
part in a save, so the chief writes the directory and the others a temporary folder they
delete (TensorFlow's multi-worker recipe, the one Keras's ``BackupAndRestore`` follows).
``BackupAndRestore`` itself is not used: it restores inside ``fit`` (the run record must know
the epoch before), deletes its backup when ``fit`` ends (no raising ``--epochs`` later), has
every Horovod rank write one folder, and saves on preemption only on Google Cloud. Each
epoch's data order follows from the seed and the epoch alone, so a resumed run trains on the
batches an unbroken one does (BatchNorm's moving statistics, kept per worker under MWMS, come
back as their mean over the workers).

With ``--checkpoint-dir``, SIGTERM/SIGUSR1 (Slurm's warning before the time limit) stop the
run like the PyTorch engine's: the workers agree every ``STOP_CHECK_EVERY`` steps and at each
epoch's end whether any of them got one, stop, and the door exits 75 (``EXIT_REQUEUE``). Unlike
the PyTorch engine it does not save mid-epoch: Keras's ``fit`` cannot start part-way through an
epoch (``BackupAndRestore`` can only through Keras internals, and restarts the data instead of
skipping what was trained), so a stop mid-epoch resumes from the last epoch's checkpoint and
redoes that epoch's steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ..core.config import TrainConfig
from ..engine.bookkeeping import RunBook, environment, weights_digest
from ..engine.checkpoint import ensure_writable
from ..engine.loop import EXIT_REQUEUE, STOP_CHECK_EVERY, RunResult
from ..engine.plan import RunPlan
from ..engine.signals import StopFlag
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


def check_config(cfg: TrainConfig) -> None:
    """What the TensorFlow door refuses, checked before TensorFlow loads (seconds on a CPU):
    a wrong flag is one line at once."""
    cfg.validate()
    if cfg.accumulate_steps > 1:
        raise GuideError(f"--accumulate-steps is not implemented in the TensorFlow door; train with python -m "
                         f"guide_utils.train, or drop it and pass --per-worker-batch "
                         f"{cfg.per_worker_batch * cfg.accumulate_steps} if that fits (the same global batch)")
    for flag, on in PYTORCH_ONLY:
        if on(cfg):
            raise GuideError(f"{flag} applies to the PyTorch engine only; drop it for python -m guide_utils.train_tf")
    check_model_name(cfg.model)  # before seconds of start-up and data generation
    if cfg.checkpoint_dir:
        ensure_writable(Path(cfg.checkpoint_dir))  # fail before any work is done


def train_tf(cfg: TrainConfig, callbacks: list | None = None) -> RunResult:
    """Train as ``cfg`` says with Keras; returns the PyTorch engine's ``RunResult``.

    ``callbacks`` are added after the guide's own (tests use one to read the learning rate
    of every batch).
    """
    check_config(cfg)
    import tensorflow as tf

    check_versions(tf.__version__, keras_version())
    dist = init(cfg.dist)
    # The same seed for the data everywhere (MWMS slices every global batch by position, so
    # all workers must shuffle alike); then, under Horovod, different initial weights per
    # worker, which rank 0's broadcast must make equal.
    tf.keras.utils.set_random_seed(cfg.seed)
    data = build_tf_data(cfg, dist)
    local_batch = cfg.per_worker_batch if dist.kind != "mwms" else cfg.per_worker_batch * dist.size
    plan = RunPlan.make(cfg, workers=dist.size, samples_per_worker=data.train_size, data_name=data.name,
                        local_batch=local_batch)
    checkpoints = _Checkpoints(cfg, dist, meta={
        "framework": "tensorflow", "model": cfg.model, "data": data.name, "num_classes": data.num_classes,
        "per_worker_batch": cfg.per_worker_batch, "workers": plan.workers})
    train_ds, val_ds = _pipelines(cfg, data, dist, local_batch, plan.steps_per_epoch, checkpoints.start_epoch)
    if dist.kind == "horovod":
        tf.random.set_seed(cfg.seed + dist.rank)
    model, optimizer = _model(cfg, plan, data, dist)
    checkpoints.restore(model, optimizer)
    book = RunBook(cfg, plan, framework="tensorflow", prefix="[train_tf]", is_root=dist.is_root,
                   data=f"{data.name}: {data.input_shape} inputs, {data.num_classes} classes",
                   environment=lambda: _environment(dist), run_name=checkpoints.run_name or cfg.run_name,
                   resume=checkpoints.start_epoch > 0,
                   resuming=f", resuming at epoch {checkpoints.start_epoch}" if checkpoints.start_epoch else "")
    checkpoints.write_meta(book.run_name)
    result = RunResult(run_name=book.run_name, record_path=book.record_path, completed_epochs=checkpoints.start_epoch)
    try:
        _fit(cfg, plan, dist, model, (train_ds, val_ds), book, checkpoints, result, callbacks)
    finally:
        book.close()
    result.weights_digest = weights_digest((w.name, w.numpy()) for w in model.trainable_weights)
    digests = dist.allgather_object(result.weights_digest)
    if not result.preempted:
        book.finish(completed_epochs=result.completed_epochs, digests=digests)
    return result


class _Stopped(Exception):
    """Leaves ``model.fit`` mid-epoch on every worker at once (``stop_training`` would still
    validate the partial epoch first)."""


def _fit(cfg: TrainConfig, plan: RunPlan, dist, model, data, book: RunBook, checkpoints: _Checkpoints,
         result: RunResult, extra: list | None) -> None:
    """``model.fit`` over the epochs still to train; with ``--checkpoint-dir`` a stop signal
    ends it early and marks ``result`` preempted."""
    start = checkpoints.start_epoch
    if start >= cfg.epochs:
        book.say(f"the checkpoint has already completed {start} epoch(s), --epochs is {cfg.epochs}: "
                 "nothing to train (raise --epochs to continue)")
        return
    # Signals are caught only when there is somewhere to save: without a checkpoint
    # directory, SIGTERM keeps its default meaning (stop now).
    stop = StopFlag()
    watch = _stop_callback(cfg, plan, dist, stop)
    cbs = [*_callbacks(cfg, plan, dist, book, checkpoints, result), *([watch] if cfg.checkpoint_dir else []),
           *(extra or [])]
    with stop if cfg.checkpoint_dir else contextlib.nullcontext():
        with contextlib.suppress(_Stopped):
            model.fit(data[0], epochs=cfg.epochs, initial_epoch=start, steps_per_epoch=plan.steps_per_epoch,
                      validation_data=data[1], callbacks=cbs, verbose=0)
    if watch.stopped_at is None:
        return
    epoch, step = watch.stopped_at
    result.preempted = True
    book.event("preempted", epoch=epoch, step=step, signal=stop.signum)
    done, by = result.completed_epochs, f"signal {stop.signum}" if stop.signum else "a signal to another worker"
    saved = (f"checkpoint saved at epoch {done}" if step == 0 else
             f"stopped {step} steps into epoch {epoch + 1}; a rerun resumes from the checkpoint of epoch {done} and "
             "redoes them (this door saves at epoch ends)" if done else
             f"stopped {step} steps into epoch {epoch + 1}, before the first checkpoint: a rerun starts over")
    book.say(f"stop requested ({by}): {saved}; exit {EXIT_REQUEUE} asks the batch script to requeue")


def _pipelines(cfg: TrainConfig, data, dist, local_batch: int, steps: int, start_epoch: int):
    """The training batches of the epochs from ``start_epoch`` on, and batched validation data.

    Epoch e reads the first ``steps`` batches of a permutation drawn from (seed, e), and
    augments sample i with the seed (seed, (e + 1) * 2**32 + i): a run resumed at epoch k
    trains on what an unbroken run does from epoch k on, without reading the epochs before."""
    import tensorflow as tf

    seed, count = tf.constant(cfg.seed, tf.int64), steps * local_batch

    def epoch(e):
        order = tf.random.experimental.stateless_shuffle(data.positions, seed=tf.stack([seed, e]))[:count]
        seeds = tf.stack([tf.fill([count], seed), (e + 1) * 2**32 + order], axis=1)
        return tf.data.Dataset.from_tensor_slices((order, seeds))

    samples = data.read(tf.data.Dataset.range(start_epoch, cfg.epochs).flat_map(epoch))
    train = samples.batch(local_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    val = data.val.batch(local_batch).prefetch(tf.data.AUTOTUNE)
    if dist.kind == "mwms":
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        train, val = train.with_options(opts), val.with_options(opts)
    return train, val


def _model(cfg: TrainConfig, plan: RunPlan, data, dist):
    """The compiled Keras model (inside the strategy's scope for MWMS) and its optimizer."""
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
    which run the checkpoints belong to; every worker restores the newest. Under MWMS every
    worker saves (BatchNorm's moving statistics are ON_READ variables: reading them for a save
    is an all-reduce), the chief into the directory, the others into a temporary folder they
    delete afterwards."""

    def __init__(self, cfg: TrainConfig, dist, meta: dict):
        self.cfg, self.dist, self.meta = cfg, dist, meta
        self.latest, self.writer, self.start_epoch, self.run_name = None, None, 0, None
        if not cfg.checkpoint_dir:
            return
        import tensorflow as tf

        self.directory = Path(cfg.checkpoint_dir)
        self.temp = self.directory / f"workertemp_{dist.rank}"
        self.latest = tf.train.latest_checkpoint(str(self.directory))
        if self.latest:  # known before the data pipeline is built: it starts at this epoch
            saved = _read_meta(self.directory / "guide_meta.json")
            different = {k: (saved.get(k), v) for k, v in meta.items() if saved.get(k) != v}
            if different:
                k, (old, new) = next(iter(different.items()))
                raise GuideError(f"{self.directory} holds a checkpoint of a different run ({k}: {old} there, {new} "
                                 "now); choose another --checkpoint-dir")
            self.start_epoch = int(self._read(lambda: tf.train.load_variable(self.latest, _EPOCH_KEY)))
            self.run_name = saved.get("run_name")

    def _read(self, what):
        try:
            return what()
        except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint gets the same advice
            raise GuideError(f"cannot read checkpoint {self.latest} ({type(exc).__name__}); remove it to start over, "
                             "or choose another --checkpoint-dir") from None

    def restore(self, model, optimizer) -> None:
        """Load the newest checkpoint (every worker reads the same file) and set up the saving."""
        if not self.cfg.checkpoint_dir:
            return
        import tensorflow as tf

        self.epoch = tf.Variable(self.start_epoch, dtype=tf.int64, trainable=False)
        ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=self.epoch)
        if self.latest:
            self._read(lambda: ckpt.restore(self.latest))
        if self.dist.is_root:
            self.writer = tf.train.CheckpointManager(ckpt, str(self.directory), max_to_keep=self.cfg.keep_checkpoints)
        elif self.dist.kind == "mwms":
            self.writer = tf.train.CheckpointManager(ckpt, str(self.temp), max_to_keep=1)

    def write_meta(self, run_name: str | None) -> None:
        """Rank 0 notes which run (settings, record name) the checkpoints belong to."""
        if not (self.cfg.checkpoint_dir and self.dist.is_root):
            return
        path = self.directory / "guide_meta.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**self.meta, "run_name": run_name}))
        os.replace(tmp, path)

    def save(self, epochs_done: int) -> None:
        """Every worker calls this at the end of every epoch; it saves where this worker must."""
        if self.writer is None:
            return
        self.epoch.assign(epochs_done)
        self.writer.save(checkpoint_number=epochs_done)
        if not self.dist.is_root:
            shutil.rmtree(self.temp, ignore_errors=True)


_EPOCH_KEY = "epoch/.ATTRIBUTES/VARIABLE_VALUE"  # the epoch variable's name inside the checkpoint


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
               result: RunResult) -> list:
    """Horovod's callbacks (broadcast, metric averaging), the learning-rate schedule, and the
    guide's per-epoch bookkeeping, in the order Horovod prescribes."""
    from ..core.schedules import keras_callback

    cbs: list = []
    if dist.kind == "horovod":
        # Broadcast first, then average metrics before anyone reads them.
        cbs += [dist.hvd.callbacks.BroadcastGlobalVariablesCallback(0), dist.hvd.callbacks.MetricAverageCallback()]
    cbs.append(keras_callback(steps_per_epoch=plan.steps_per_epoch, **plan.schedule))
    cbs.append(_epoch_callback(cfg, plan, dist, book, checkpoints, result))
    return cbs


def _epoch_callback(cfg: TrainConfig, plan: RunPlan, dist, book: RunBook, checkpoints: _Checkpoints,
                    result: RunResult):
    """Per epoch: throughput, the record line, the printed line and the checkpoint."""
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
            result.epochs.append(row)
            result.completed_epochs = epoch + 1
            checkpoints.save(epoch + 1)
            book.epoch(row)

    return EpochBookkeeping()


def _stop_callback(cfg: TrainConfig, plan: RunPlan, dist, stop: StopFlag):
    """Asks every ``STOP_CHECK_EVERY`` steps and after each epoch's checkpoint whether any
    worker got a stop signal; all workers ask at the same steps, so all stop together."""
    import tensorflow as tf

    class StopOnSignal(tf.keras.callbacks.Callback):
        stopped_at: tuple[int, int] | None = None  # (epoch, step) of the stop

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            step = batch + 1  # the last step is left to on_epoch_end: that epoch is then saved
            if step % STOP_CHECK_EVERY == 0 and step < plan.steps_per_epoch and dist.any_worker(bool(stop.signum)):
                self.stopped_at = (self.epoch, step)
                raise _Stopped

        def on_epoch_end(self, epoch, logs=None):
            if epoch + 1 < cfg.epochs and dist.any_worker(bool(stop.signum)):
                self.stopped_at = (epoch + 1, 0)
                self.model.stop_training = True

    return StopOnSignal()
