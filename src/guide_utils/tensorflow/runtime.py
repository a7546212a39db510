"""TensorFlow's side of a run: which TensorFlow/Keras it can be (Horovod 0.28.1 builds
against TensorFlow up to 2.15, the last with Keras 2), and how the workers find each other:
Horovod, or TensorFlow's own MultiWorkerMirroredStrategy with the cluster taken from Slurm.

>>> check_versions("2.15.1", "2.15.0")
>>> check_versions("2.16.1", "3.3.3")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
guide_utils.core.errors.GuideError: TensorFlow 2.16.1 with Keras 3.3.3: Horovod 0.28.1 supports Keras 2 only ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..core.errors import GuideError
from ..runtime.gpus import VISIBLE, allocated, device_index

MIN_TF, MAX_TF = (2, 9), (2, 15)
DISTS = ("none", "horovod", "mwms")


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
    _sum: Any = field(default=None, repr=False)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def allgather_object(self, obj):
        if self.kind == "horovod":
            import horovod.tensorflow

            return horovod.tensorflow.allgather_object(obj)
        return [obj]  # mwms: mirrored variables are kept identical by the strategy itself

    def any_worker(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any worker: a collective, so every worker must ask at the
        same point of the run (a stop signal may reach only some of them)."""
        import tensorflow as tf

        if self.kind == "horovod":
            import horovod.tensorflow

            total = horovod.tensorflow.allreduce(tf.constant([float(flag)]), op=horovod.tensorflow.Sum,
                                                 name="guide_stop")
            return float(total[0]) > 0
        if self.kind == "mwms":
            if self._sum is None:  # traced once: a collective over every replica of every worker
                strategy = self.strategy
                self._sum = tf.function(lambda x: strategy.reduce(
                    tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, args=(x,)), axis=None))
            return float(self._sum(tf.constant(float(flag)))) > 0
        return flag


def check_gpus(env: Mapping[str, str], seen: int, tf_version: str, build: str) -> None:
    """Refuse, in one line, to train on the CPU when the job gave this process GPUs (``env``
    names them) that this TensorFlow does not see (``seen``: how many it does): the lock's
    tensorflow-cpu, or a build for the other vendor, would otherwise hold the GPUs all run long
    (under MWMS with the RING collective, over the CPUs)."""
    given = allocated(env)
    if given and not seen:
        wanted = ("a ROCm build of TensorFlow 2.15 (AMD's tensorflow-rocm)" if given.startswith(VISIBLE[1:]) else
                  "tensorflow==2.15.1 (the GPU wheel) instead of tensorflow-cpu")
        raise GuideError(f"the job has GPUs ({given}) but this TensorFlow {tf_version} ({build} build) sees none; "
                         f"refusing to train on the CPU: install {wanted} or load the site's TensorFlow module "
                         "(docs/usage.md, 'Running on a real cluster'), or run a job without GPUs")


def init(kind: str) -> TFDist:
    """Start the TensorFlow side of distribution; pins one GPU per process where there are GPUs,
    and refuses to start on the CPU where the job has GPUs this TensorFlow does not see."""
    if kind not in DISTS:
        raise GuideError(f"--dist {kind} is not available with TensorFlow; choose from {', '.join(DISTS)} "
                         "(DDP is PyTorch's)")
    import os

    import tensorflow as tf

    build = "CUDA" if tf.test.is_built_with_cuda() else "ROCm" if tf.test.is_built_with_rocm() else "CPU-only"
    check_gpus(os.environ, len(tf.config.list_physical_devices("GPU")), tf.__version__, build)
    if kind == "horovod":
        return _init_horovod()
    if kind == "mwms":
        return _init_mwms()
    return TFDist("none")


def _init_horovod() -> TFDist:
    import tensorflow as tf

    from ..runtime import launchers

    launcher = launchers.require("horovod")
    try:
        import horovod.tensorflow.keras as hvd
    except ImportError as exc:
        raise GuideError(f"Horovod's TensorFlow support is missing ({exc}); rebuild Horovod with "
                         "HOROVOD_WITH_TENSORFLOW=1 (scripts/setup.sh does), or use --dist mwms") from None
    hvd.init()
    launcher.check_world(hvd.size(), "Horovod")
    _pin_gpu(hvd.local_rank())
    return TFDist("horovod", hvd.rank(), hvd.size(), hvd.local_rank(), hvd=hvd)


def _pin_gpu(local_rank: int) -> list:
    """Make this process see one GPU, the one its local rank takes (``runtime.gpus.device_index``,
    the PyTorch side's rule: its own where each task sees every GPU of the node, GPU 0 where each
    sees only its own); the GPUs this process saw before, [] on CPUs."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        gpu = gpus[device_index(local_rank, len(gpus))]
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")
    return gpus


def _init_mwms() -> TFDist:
    """MultiWorkerMirroredStrategy over the workers TF_CONFIG lists, or over the tasks of
    the srun step this process belongs to."""
    import os

    import tensorflow as tf

    from ..runtime import launchers

    if "TF_CONFIG" in os.environ:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        gpus = tf.config.list_physical_devices("GPU")
    else:
        launcher = launchers.require("mwms")
        job = launcher.job
        # The resolver's own GPU placement writes CUDA_VISIBLE_DEVICES, too late: TensorFlow has
        # already listed the GPUs (init's check), so every task of a node would take GPU 0. Each
        # task pins its GPU itself; the resolver, told of one GPU per task (one notional GPU on
        # CPU nodes: it lists no task without one), only names the workers. Each task gets
        # port_base + its index on the node; the base follows the job id, like the PyTorch
        # rendezvous, so two jobs sharing a node do not collide.
        gpus = _pin_gpu(launcher.local_rank)
        per_node = max(job.tasks_per_node or [job.step_ntasks or job.ntasks])
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
            port_base=job.master_port + 1000, gpus_per_node=per_node, gpus_per_task=1, auto_set_gpu=False)
    impl = (tf.distribute.experimental.CommunicationImplementation.NCCL if gpus
            else tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver,
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=impl))
    return TFDist("mwms", rank=int(resolver.task_id or 0), size=strategy.num_replicas_in_sync, strategy=strategy)
