"""The TensorFlow door: Keras training under Horovod, or under TensorFlow's own
MultiWorkerMirroredStrategy, with the PyTorch engine's settings, schedule and run records.

What is shared with the PyTorch engine, not re-implemented: the configuration and its
profiles (``config``), the learning-rate rule (``scaling``) and schedule (``schedules``,
applied per batch by ``schedules.keras_callback``), the datasets (``data.arrays``), the
throughput meter and the run records. What is TensorFlow's or Horovod's own:

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
finished epoch. The version trap: Horovod 0.28.1 builds against TensorFlow up to 2.15, the
last release with Keras 2; ``check_versions`` stops with one line on anything else.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import GuideError
from ..config import TrainConfig

MIN_TF, MAX_TF = (2, 9), (2, 15)
DISTS = ("none", "horovod", "mwms")
KERAS_APPLICATIONS = {"resnet50": "ResNet50", "resnet101": "ResNet101", "resnet152": "ResNet152",
                      "mobilenet_v2": "MobileNetV2", "vgg16": "VGG16"}
SMALL_MODELS = ("small_resnet", "mnist1d_cnn")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def check_versions(tf_version: str, keras_version: str) -> None:
    """Refuse TensorFlow/Keras combinations Horovod 0.28.1 cannot work with, in one line."""
    try:
        tf_v = tuple(int(p) for p in tf_version.split(".")[:2])
        keras_major = int(keras_version.split(".")[0])
    except ValueError:
        raise GuideError(f"cannot read the TensorFlow/Keras versions {tf_version!r}/{keras_version!r}") from None
    fix = "install tensorflow-cpu==2.15.1 (or tensorflow==2.15.1 on GPUs) and keras==2.15.0, as requirements.txt pins"
    if keras_major >= 3 or tf_v > MAX_TF:
        raise GuideError(f"TensorFlow {tf_version} with Keras {keras_version}: Horovod 0.28.1 supports Keras 2 only "
                         f"(TensorFlow <= 2.15; 2.16 switched to Keras 3); {fix}")
    if tf_v < MIN_TF:
        raise GuideError(f"TensorFlow {tf_version} is too old for this guide (needs 2.9 to 2.15); {fix}")


def keras_version() -> str:
    """The Keras that ``tf.keras`` is (the ``keras`` package; Keras 3 when TensorFlow >= 2.16)."""
    try:
        import keras
    except ImportError:
        import tensorflow as tf

        return getattr(tf.keras, "__version__", "0")
    return keras.__version__


@dataclass
class TFDist:
    kind: str
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    hvd: Any = None
    strategy: Any = None

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def allgather_object(self, obj):
        if self.kind == "horovod":
            import horovod.tensorflow

            return horovod.tensorflow.allgather_object(obj)
        return [obj]  # mwms: mirrored variables are kept identical by the strategy itself


def init(kind: str) -> TFDist:
    """Start the TensorFlow side of distribution; pins one GPU per process where there are GPUs."""
    import tensorflow as tf

    if kind not in DISTS:
        raise GuideError(f"--dist {kind} is not available with TensorFlow; choose from {', '.join(DISTS)} "
                         "(DDP is PyTorch's)")
    gpus = tf.config.list_physical_devices("GPU")
    if kind == "horovod":
        try:
            import horovod.tensorflow.keras as hvd
        except ImportError as exc:
            raise GuideError(f"Horovod's TensorFlow support is missing ({exc}); rebuild Horovod with "
                             "HOROVOD_WITH_TENSORFLOW=1 (scripts/setup.sh does)") from None
        hvd.init()
        if gpus:
            tf.config.experimental.set_memory_growth(gpus[hvd.local_rank()], True)
            tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
        return TFDist("horovod", hvd.rank(), hvd.size(), hvd.local_rank(), hvd=hvd)
    if kind == "mwms":
        from ..cluster.slurm import SlurmJob

        job = SlurmJob.from_env()
        if job is not None and job.procid is not None and job.ntasks > 1:
            # Each task gets port_base + its index on the node; the base follows the job id,
            # like the PyTorch rendezvous, so two jobs sharing a node do not collide.
            if job.gpus_per_node:
                resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
                    port_base=job.master_port + 1000, gpus_per_node=job.gpus_per_node)
            else:
                # The resolver pairs every task with GPU ids and lists no task without one:
                # on CPU nodes give it one notional GPU per task and keep it from setting
                # CUDA_VISIBLE_DEVICES.
                per_node = max(job.tasks_per_node or [job.ntasks])
                resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
                    port_base=job.master_port + 1000, gpus_per_node=per_node, gpus_per_task=1, auto_set_gpu=False)
        else:
            resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        impl = (tf.distribute.experimental.CommunicationImplementation.NCCL if gpus
                else tf.distribute.experimental.CommunicationImplementation.RING)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver,
            communication_options=tf.distribute.experimental.CommunicationOptions(implementation=impl))
        task = resolver.task_id or 0
        return TFDist("mwms", rank=int(task), size=strategy.num_replicas_in_sync, strategy=strategy)
    return TFDist("none")


# -- models -----------------------------------------------------------------------------
def check_model_name(name: str) -> None:
    if name not in (*SMALL_MODELS, *KERAS_APPLICATIONS):
        known = ", ".join([*SMALL_MODELS, *KERAS_APPLICATIONS])
        raise GuideError(f"unknown model {name!r} for TensorFlow; choose from {known}")


def build_keras_model(name: str, *, num_classes: int, input_shape: tuple[int, ...], weight_decay: float):
    """A Keras model by the PyTorch engine's names (channels-last ``input_shape``), with
    weight decay as an L2 penalty on every kernel: ``wd/2 * |w|^2`` gives SGD the same
    ``wd * w`` gradient term that PyTorch's ``weight_decay`` adds."""
    import tensorflow as tf

    check_model_name(name)
    L = tf.keras.layers
    if name == "mnist1d_cnn":
        if len(input_shape) != 2:
            raise GuideError(f"model mnist1d_cnn takes 1-D signals, but the data has shape {tuple(input_shape)}; "
                             "use --data mnist1d, or small_resnet for image data")
        x = inp = L.Input(input_shape)
        for stride in (1, 2, 2):
            x = L.Conv1D(32, 5, stride, padding="same", use_bias=False)(x)
            x = L.ReLU()(L.BatchNormalization()(x))
        model = tf.keras.Model(inp, L.Dense(num_classes)(L.Flatten()(x)), name=name)
    elif len(input_shape) != 3:
        raise GuideError(f"model {name} takes images, but the data has shape {tuple(input_shape)}; "
                         "use mnist1d_cnn for --data mnist1d")
    elif name == "small_resnet":
        def block(x, cout, stride):
            y = L.Conv2D(cout, 3, stride, padding="same", use_bias=False)(x)
            y = L.ReLU()(L.BatchNormalization()(y))
            y = L.BatchNormalization()(L.Conv2D(cout, 3, 1, padding="same", use_bias=False)(y))
            if stride != 1 or x.shape[-1] != cout:
                x = L.BatchNormalization()(L.Conv2D(cout, 1, stride, use_bias=False)(x))
            return L.ReLU()(y + x)

        x = inp = L.Input(input_shape)
        x = L.ReLU()(L.BatchNormalization()(L.Conv2D(16, 3, 1, padding="same", use_bias=False)(x)))
        x = block(block(block(x, 16, 1), 32, 2), 64, 2)
        model = tf.keras.Model(inp, L.Dense(num_classes)(L.GlobalAveragePooling2D()(x)), name=name)
    else:
        app = getattr(tf.keras.applications, KERAS_APPLICATIONS[name])
        model = app(weights=None, input_shape=input_shape, classes=num_classes, classifier_activation=None)
    if weight_decay:
        for w in model.trainable_weights:
            if "kernel" in w.name:
                model.add_loss(lambda w=w: 0.5 * weight_decay * tf.reduce_sum(tf.square(w)))
    return model


# -- data -------------------------------------------------------------------------------
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

    from ..engine.data import arrays

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


# -- training ---------------------------------------------------------------------------
def environment(dist: TFDist) -> dict[str, Any]:
    import tensorflow as tf

    from ..cluster.slurm import SlurmJob

    env: dict[str, Any] = {"host": platform.node(), "python": platform.python_version(),
                           "tensorflow": tf.__version__, "keras": keras_version(), "dist": dist.kind,
                           "workers": dist.size, "gpus": len(tf.config.list_physical_devices("GPU"))}
    if dist.kind == "horovod":
        import horovod

        env["horovod"] = horovod.__version__
    job = SlurmJob.from_env()
    env["slurm"] = asdict(job) if job else None
    return env


def weights_digest(model) -> str:
    h = hashlib.sha256()
    for w in model.weights:  # trainable and BatchNorm statistics: Keras keeps both per worker
        if w.trainable:
            h.update(w.numpy().tobytes())
    return h.hexdigest()[:16]


def train_tf(cfg: TrainConfig, callbacks: list | None = None):
    """Train as ``cfg`` says with Keras; returns the PyTorch engine's ``RunResult``.

    ``callbacks`` are added after the guide's own (tests use one to read the learning rate
    of every batch).
    """
    cfg.validate()
    for flag, on in (("--amp", cfg.amp != "none"), ("--channels-last", cfg.channels_last),
                     ("--compile", cfg.compile), ("--fp16-allreduce", cfg.fp16_allreduce)):
        if on:
            raise GuideError(f"{flag} applies to the PyTorch engine only; drop it for python -m guide_utils.train_tf")
    check_model_name(cfg.model)  # before seconds of start-up and data generation
    import tensorflow as tf

    check_versions(tf.__version__, keras_version())
    from ..results import records
    from ..engine.loop import RunResult
    from ..scaling import global_batch, scaled_lr
    from ..schedules import keras_callback
    dist = init(cfg.dist)
    if cfg.checkpoint_dir and dist.kind == "mwms":
        raise GuideError("--checkpoint-dir is not wired for --dist mwms (TensorFlow needs every worker to save); "
                         "use --dist horovod, or tf.keras.callbacks.BackupAndRestore in your own script")
    # The same seed for the data everywhere (MWMS slices every global batch by position, so
    # all workers must shuffle alike); then, under Horovod, different initial weights per
    # worker, which rank 0's broadcast must make equal.
    tf.keras.utils.set_random_seed(cfg.seed)
    data = build_tf_data(cfg, dist)
    workers = dist.size
    gbatch = global_batch(cfg.per_worker_batch, workers)
    peak_lr = scaled_lr(cfg.base_lr, cfg.base_batch, gbatch, rule=cfg.lr_scaling)
    start_lr = cfg.warmup_start_lr()
    local_batch = cfg.per_worker_batch if dist.kind != "mwms" else gbatch  # MWMS splits the global batch
    steps = data.train_size // local_batch
    if steps == 0:
        raise GuideError(f"{data.name}: {data.train_size} training samples per worker's share are fewer than one batch "
                         f"of {local_batch}; use a smaller --per-worker-batch or fewer workers")
    if cfg.max_steps_per_epoch:
        steps = min(steps, cfg.max_steps_per_epoch)
    train_ds = (data.train.shuffle(min(data.train_size, 50_000), seed=cfg.seed, reshuffle_each_iteration=True)
                .batch(local_batch, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE))
    val_ds = data.val.batch(local_batch).prefetch(tf.data.AUTOTUNE)
    if dist.kind == "mwms":
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        train_ds, val_ds = train_ds.with_options(opts), val_ds.with_options(opts)

    if dist.kind == "horovod":
        tf.random.set_seed(cfg.seed + dist.rank)
    scope = dist.strategy.scope() if dist.strategy else _nullcontext()
    with scope:
        model = build_keras_model(cfg.model, num_classes=data.num_classes, input_shape=data.input_shape,
                                  weight_decay=cfg.weight_decay)
        optimizer = tf.keras.optimizers.legacy.SGD(learning_rate=peak_lr, momentum=cfg.momentum)
        if dist.kind == "horovod":
            optimizer = dist.hvd.DistributedOptimizer(optimizer)
        model.compile(optimizer=optimizer,
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name="top1"),
                               tf.keras.metrics.SparseTopKCategoricalAccuracy(k=5, name="top5")])

    ckpt = manager = None
    start_epoch, run_name = 0, cfg.run_name
    meta = {"framework": "tensorflow", "model": cfg.model, "data": data.name, "num_classes": data.num_classes,
            "per_worker_batch": cfg.per_worker_batch, "workers": workers}
    if cfg.checkpoint_dir:
        ckpt_dir = Path(cfg.checkpoint_dir)
        epoch_var = tf.Variable(0, dtype=tf.int64, trainable=False)
        ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch_var)
        manager = tf.train.CheckpointManager(ckpt, str(ckpt_dir), max_to_keep=cfg.keep_checkpoints)
        meta_file = ckpt_dir / "guide_meta.json"
        if manager.latest_checkpoint:
            saved = _read_meta(meta_file)
            different = {k: (saved.get(k), v) for k, v in meta.items() if saved.get(k) != v}
            if different:
                k, (old, new) = next(iter(different.items()))
                raise GuideError(f"{ckpt_dir} holds a checkpoint of a different run ({k}: {old} there, {new} now); "
                                 "choose another --checkpoint-dir")
            try:
                ckpt.restore(manager.latest_checkpoint)  # every worker reads the same file
            except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint gets the same advice
                raise GuideError(f"cannot read checkpoint {manager.latest_checkpoint} ({type(exc).__name__}); "
                                 "remove it to start over, or choose another --checkpoint-dir") from None
            start_epoch, run_name = int(epoch_var.numpy()), saved.get("run_name") or run_name

    recorder = None
    record_config = {**asdict(cfg), "framework": "tensorflow", "workers": workers, "global_batch": gbatch,
                     "peak_lr": peak_lr, "steps_per_epoch": steps, "data": data.name}
    if dist.is_root:
        recorder = records.RunRecorder(Path(cfg.results_dir), run_name or _default_run_name(cfg, workers),
                                       config=record_config, environment=environment(dist),
                                       resume=start_epoch > 0 and run_name is not None)
        run_name = recorder.run_name
        if cfg.checkpoint_dir:
            Path(cfg.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            _write_meta(Path(cfg.checkpoint_dir) / "guide_meta.json", {**meta, "run_name": run_name})
        where = f", resuming at epoch {start_epoch}" if start_epoch else ""
        print(f"[train_tf] {data.name}: {data.input_shape} inputs, {data.num_classes} classes; model {cfg.model}; "
              f"{workers} worker(s) x {cfg.per_worker_batch} = global batch {gbatch} ({dist.kind}); peak lr "
              f"{peak_lr:g} ({cfg.lr_scaling} rule), warmup {cfg.warmup}{where}; record {recorder.path}", flush=True)

    schedule = {"peak_lr": peak_lr, "warmup": cfg.warmup, "warmup_epochs": cfg.warmup_epochs,
                "warmup_start_lr": start_lr if cfg.warmup == "gradual" else None,
                "milestones": cfg.milestones, "gamma": cfg.gamma}
    cbs: list = []
    if dist.kind == "horovod":
        # Order as Horovod prescribes: broadcast first, then average metrics before anyone reads them.
        cbs += [dist.hvd.callbacks.BroadcastGlobalVariablesCallback(0), dist.hvd.callbacks.MetricAverageCallback()]
    cbs.append(keras_callback(steps_per_epoch=steps, **schedule))
    rows: list[dict] = []
    cbs.append(_progress(cfg, recorder, manager, dist, rows))
    cbs += callbacks or []

    result = RunResult(run_name=run_name, record_path=recorder.path if recorder else None,
                       completed_epochs=start_epoch)
    if start_epoch < cfg.epochs:
        model.fit(train_ds, epochs=cfg.epochs, initial_epoch=start_epoch, steps_per_epoch=steps,
                            validation_data=val_ds, callbacks=cbs, verbose=0)
        result.completed_epochs = cfg.epochs
        result.epochs = rows
    elif dist.is_root:
        print(f"[train_tf] the checkpoint has already completed {start_epoch} epoch(s), --epochs is {cfg.epochs}: "
              "nothing to train (raise --epochs to continue)", flush=True)
    result.weights_digest = weights_digest(model)
    digests = dist.allgather_object(result.weights_digest)
    if recorder:
        best = min((e["val_top1_err"] for e in records.read_run(recorder.path).epochs.to_dict("records")),
                   default=None) if result.completed_epochs else None
        recorder.summary(completed_epochs=result.completed_epochs, weights_digests=digests,
                         ranks_agree=len(set(digests)) == 1, best_val_top1_err=best)
    return result


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _read_meta(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        raise GuideError(f"{path} is missing or unreadable, so the checkpoint beside it cannot be checked; "
                         "choose another --checkpoint-dir") from None


def _write_meta(path: Path, meta: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, path)


def _default_run_name(cfg: TrainConfig, workers: int) -> str:
    data = Path(cfg.data).name if os.path.isdir(cfg.data) else cfg.data
    return (f"tf-{cfg.model}-{data}-{cfg.dist}-{workers}x{cfg.per_worker_batch}-{cfg.lr_scaling}-{cfg.warmup}"
            f"-seed{cfg.seed}")


def _progress(cfg, recorder, manager, dist, rows: list):
    """Per epoch: throughput, the record line, the printed line and (rank 0) the checkpoint."""
    import tensorflow as tf

    from ..throughput import ThroughputMeter

    class Progress(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()
            self.meter = ThroughputMeter(cfg.per_worker_batch, dist.size, cfg.throughput_warmup_iters)

        def on_train_batch_end(self, batch, logs=None):
            self.meter.step()

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            seconds = time.perf_counter() - self.start
            rate = self.meter.images_per_second() if self.meter.measured_iters else None
            row = {"epoch": epoch + 1, "lr": logs.get("lr"), "loss": logs.get("loss"),
                   "train_top1_err": 100.0 * (1 - logs["top1"]),
                   "val_top1_err": 100.0 * (1 - logs["val_top1"]),
                   "val_top5_err": 100.0 * (1 - logs["val_top5"]),
                   "images_per_second": rate, "seconds": seconds}
            rows.append(row)
            if manager is not None and dist.is_root:
                manager.checkpoint.epoch.assign(epoch + 1)
                manager.save(checkpoint_number=epoch + 1)
            if recorder:
                recorder.epoch(**row)
                r = f"{rate:.0f} img/s" if rate else "img/s n/a"
                print(f"[train_tf] epoch {epoch + 1}/{cfg.epochs}  lr {row['lr']:.4g}  loss {row['loss']:.4f}  "
                      f"train top-1 err {row['train_top1_err']:.2f}%  val top-1 err {row['val_top1_err']:.2f}% "
                      f"top-5 {row['val_top5_err']:.2f}%  {r}  {seconds:.1f} s", flush=True)

    return Progress()
