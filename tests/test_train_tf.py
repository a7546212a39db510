"""The TensorFlow door on CPU: Horovod over Gloo and MPI, MultiWorkerMirroredStrategy, the
schedule, resume, a stop signal under both, the benchmark, the version guard and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import BIN, MPI_AS_ROOT, child_env
from guide_utils.core.errors import GuideError
from guide_utils.core.schedules import lr_at
from guide_utils.runtime.local import tf_config
from guide_utils.tensorflow.runtime import check_versions

PY = sys.executable
REPO = Path(__file__).resolve().parents[1]
TRAIN_TF = [PY, "-m", "guide_utils.train_tf", "--profile", "smoke"]
TIMEOUT = 300
TF_QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", **MPI_AS_ROOT}  # TensorFlow's C++ start-up chatter off
SHORT = ["--max-steps-per-epoch", "20"]  # the stop tests: start-up is most of their time, keep the epochs short


def _lines(results: Path) -> list[dict]:
    (f,) = sorted(results.glob("*.jsonl"))
    return [json.loads(line) for line in f.read_text().splitlines()]


@pytest.mark.parametrize("tf_version, keras_version, message", [
    ("2.16.1", "3.3.3", "Horovod 0.28.1 supports Keras 2 only"),
    ("2.15.1", "3.0.0", "Horovod 0.28.1 supports Keras 2 only"),
    ("2.8.0", "2.8.0", "too old"),
    ("nightly", "x", "cannot read"),
])
def test_unsupported_tensorflow_keras_combinations_are_refused(tf_version, keras_version, message):
    with pytest.raises(GuideError, match=message):
        check_versions(tf_version, keras_version)


def test_the_pinned_versions_pass_the_guard():
    import keras
    import tensorflow as tf

    check_versions(tf.__version__, keras.__version__)


def test_the_door_refuses_to_train_on_the_cpu_when_the_job_has_gpus(tmp_path, monkeypatch, capsys):
    """GPUs in the allocation that this TensorFlow (the lock's tensorflow-cpu) does not see: one
    line naming both, exit 2, and no run record; no silent CPU run under the RING collective."""
    import tensorflow as tf

    from guide_utils import train_tf
    from guide_utils.tensorflow.runtime import check_gpus

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this TensorFlow sees a GPU: the refusal needs one that sees none (the lock's tensorflow-cpu)")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # what Slurm's GRES plugin sets in a GPU step
    for dist in ("mwms", "none"):
        assert train_tf.main(["--profile", "smoke", "--dist", dist, "--results-dir", str(tmp_path / "r")]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"{train_tf.PROG}: error: the job has GPUs (CUDA_VISIBLE_DEVICES=0,1) but this "
                               f"TensorFlow {tf.__version__} (CPU-only build) sees none; refusing to train on the CPU")
        assert not (tmp_path / "r").exists()
    with pytest.raises(GuideError, match=r"ROCR_VISIBLE_DEVICES=0,1\) .* install a ROCm build of TensorFlow"):
        check_gpus({"ROCR_VISIBLE_DEVICES": "0,1"}, 0, "2.15.1", "CUDA 12.2")
    check_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}, 2, "2.15.1", "CUDA 12.2")  # it sees them: trains
    check_gpus({"CUDA_VISIBLE_DEVICES": "", "SLURM_GPUS_ON_NODE": "0"}, 0, "2.15.1", "CPU-only")  # a CPU job


# The launcher-related variables a stand-in environment replaces (pytest may run inside a job).
LAUNCH_PREFIXES = ("SLURM", "OMPI_", "PMIX_", "PMI_", "HOROVOD_", "TF_CONFIG", "CUDA_VISIBLE", "ROCR_", "HIP_",
                   "JSM_", "LSB_", "PBS_", "MPI_LOCAL", "LOCAL_RANK", "RANK", "WORLD_SIZE", "GROUP_", "TORCHELASTIC")


def _fake_gpus(monkeypatch, env: dict[str, str], count: int) -> tuple[list[str], dict]:
    """This process under a launcher's ``env`` with ``count`` GPUs TensorFlow lists (stand-ins):
    the GPUs, and what the code under test made visible and grew (``seen``)."""
    import tensorflow as tf

    for name in [n for n in os.environ if n.startswith(LAUNCH_PREFIXES)]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    gpus = [f"/physical_device:GPU:{i}" for i in range(count)]
    seen: dict = {"visible": [], "growth": []}
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: list(gpus) if kind == "GPU" else [])
    monkeypatch.setattr(tf.config, "set_visible_devices", lambda d, kind=None: seen["visible"].append((d, kind)))
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth", lambda d, on: seen["growth"].append(d))
    return gpus, seen


def test_mwms_tasks_of_a_node_that_sees_every_gpu_each_take_their_own(monkeypatch):
    """srun --ntasks-per-node=4 with --gpus-per-node=4 (or --gpu-bind=none): each task sees the
    node's 4 GPUs and TensorFlow has listed them before the resolver could set CUDA_VISIBLE_DEVICES,
    so the task pins the one of its local rank itself; the resolver gives each worker one GPU."""
    import tensorflow as tf

    from guide_utils.tensorflow import runtime

    task = {"SLURMD_NODENAME": "guide-n2", "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "guide-n[1-2]",
            "SLURM_JOB_NUM_NODES": "2", "SLURM_LOCALID": "2", "SLURM_NODEID": "1", "SLURM_NTASKS": "8",
            "SLURM_NTASKS_PER_NODE": "4", "SLURM_PROCID": "6", "SLURM_STEPID": "0", "SLURM_STEP_ID": "0",
            "SLURM_STEP_NODELIST": "guide-n[1-2]", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "8",
            "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_GPUS_ON_NODE": "4",
            "SLURM_JOB_GPUS": "0,1,2,3"}
    gpus, seen = _fake_gpus(monkeypatch, task, 4)
    built = {}

    class Strategy:  # the real one would open its gRPC server and wait for the other workers
        num_replicas_in_sync = 8

        def __init__(self, cluster_resolver, communication_options):
            built["spec"] = cluster_resolver.cluster_spec().as_dict()
            built["accelerators"] = cluster_resolver.num_accelerators()

    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", Strategy)
    dist = runtime._init_mwms()
    assert seen == {"visible": [(gpus[2], "GPU")], "growth": [gpus[2]]}
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # the resolver set no device list behind TensorFlow's back
    assert built["accelerators"] == {"GPU": 1} and len(built["spec"]["worker"]) == 8
    assert (dist.rank, dist.size) == (6, 8)


def test_horovod_task_bound_to_its_own_gpu_takes_the_one_it_sees(monkeypatch):
    """srun --gpus-per-task=1 (bound): local rank 1 sees one GPU, its own; it takes GPU 0 of its
    list instead of failing on gpus[1]. Where it sees the node's two GPUs, it takes the second."""
    from types import ModuleType

    from guide_utils.tensorflow import runtime

    hvd = ModuleType("horovod.tensorflow.keras")
    hvd.init, hvd.size, hvd.rank, hvd.local_rank = (lambda: None), (lambda: 2), (lambda: 1), (lambda: 1)
    top, tf_mod = ModuleType("horovod"), ModuleType("horovod.tensorflow")
    top.tensorflow, tf_mod.keras = tf_mod, hvd
    for name, module in (("horovod", top), ("horovod.tensorflow", tf_mod), ("horovod.tensorflow.keras", hvd)):
        monkeypatch.setitem(sys.modules, name, module)
    rank1 = {"HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_RANK": "1", "HOROVOD_SIZE": "2",
             "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1", "HOROVOD_HOSTNAME": "localhost",
             "HOROVOD_CONTROLLER": "gloo", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
             "HOROVOD_GLOO_RENDEZVOUS_PORT": "65365"}
    for count, taken in ((1, 0), (2, 1)):
        gpus, seen = _fake_gpus(monkeypatch, rank1, count)
        dist = runtime._init_horovod()
        assert seen == {"visible": [(gpus[taken], "GPU")], "growth": [gpus[taken]]}
        assert (dist.rank, dist.size, dist.local_rank) == (1, 2, 1)


@pytest.mark.slow
def test_learning_rate_of_every_batch_follows_lr_at(tmp_path):
    """Gradual warmup over 1 epoch, drops at epochs 2 and 3: the optimizer's rate at each
    batch equals schedules.lr_at, the same function the PyTorch engine follows."""
    import tensorflow as tf

    from guide_utils.core.config import make_config
    from guide_utils.tensorflow.engine import train_tf

    seen: list[float] = []

    class Spy(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(tf.keras.backend.get_value(self.model.optimizer.learning_rate)))

    cfg = make_config("smoke", epochs=3, warmup="gradual", per_worker_batch=64, max_steps_per_epoch=10,
                      results_dir=str(tmp_path))
    result = train_tf(cfg, callbacks=[Spy()])
    peak, start = 0.1 * 64 / 256, 0.1 * 64 / 256  # one worker: the warmup starts at the peak rate
    expected = [lr_at(e + b / 10, peak_lr=peak, warmup="gradual", warmup_epochs=1, warmup_start_lr=start,
                      milestones=(2, 3), gamma=0.1) for e in range(3) for b in range(10)]
    assert seen == pytest.approx(expected, rel=1e-6)
    assert [row["epoch"] for row in result.epochs] == [1, 2, 3]


def test_image_folder_samples_are_what_keras_loads(tmp_path):
    """Training images are read by position (an epoch's order comes from the seed and the
    epoch); each is the image and label Keras's own loader gives, or its mirror (random flip)."""
    import numpy as np
    import tensorflow as tf

    from conftest import make_image_tree
    from guide_utils.core.config import make_config
    from guide_utils.tensorflow.data import IMAGENET_MEAN, IMAGENET_STD, build_tf_data
    from guide_utils.tensorflow.runtime import TFDist

    root = make_image_tree(tmp_path / "imgs")
    data = build_tf_data(make_config("smoke", data=str(root), image_size=32), TFDist("none"))
    keras = tf.keras.utils.image_dataset_from_directory(str(root / "train"), image_size=(32, 32), batch_size=None,
                                                        shuffle=False, label_mode="int")
    seeds = tf.constant([[0, 1]] * data.train_size, dtype=tf.int64)
    samples = list(data.read(tf.data.Dataset.from_tensor_slices((data.positions, seeds))))
    assert len(samples) == data.train_size == 6
    for (x, y), (kx, ky) in zip(samples, keras):
        want = (kx.numpy() / 255.0 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
        assert int(y) == int(ky)
        assert np.allclose(x, want, atol=1e-5) or np.allclose(x, want[:, ::-1], atol=1e-5)


@pytest.mark.parametrize("mode", ["synthetic", "synthetic-loader", "synthetic-resident"])
def test_every_synthetic_mode_of_the_engine_is_the_tf_pool(mode):
    """The benchmarks pass the engine's mode names (synthetic-loader by default); the TensorFlow
    door reads each as its pool of random images, never as a dataset directory."""
    import tensorflow as tf

    from guide_utils.core.config import make_config
    from guide_utils.tensorflow.data import build_tf_data
    from guide_utils.tensorflow.runtime import TFDist

    data = build_tf_data(make_config("smoke", data=mode, image_size=16, synthetic_size=64), TFDist("none"))
    seeds = tf.constant([[0, 1]] * 2, dtype=tf.int64)
    (x, y), _ = list(data.read(tf.data.Dataset.from_tensor_slices((data.positions[:2], seeds))))
    assert data.train_size == 64 and tuple(x.shape) == (16, 16, 3) and 0 <= int(y) < 1000


@pytest.mark.slow
@pytest.mark.multiprocess
# horovodrun --gloo: chapter 8 trains that way and asserts the same (one notebook run per session)
@pytest.mark.parametrize("launcher", ["mpirun"])
def test_two_horovod_workers_end_with_identical_weights(tmp_path, launcher):
    start = {"horovodrun-gloo": [str(BIN / "horovodrun"), "-np", "2", "--gloo"],
             "mpirun": ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"]}[launcher]
    cmd = [*start, *TRAIN_TF, "--dist", "horovod", "--epochs", "2", "--warmup", "gradual", "--results-dir", "r"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=child_env(**TF_QUIET), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = _lines(tmp_path / "r")
    config, summary = lines[0]["config"], lines[-1]
    assert (config["framework"], config["workers"], config["global_batch"]) == ("tensorflow", 2, 64)
    assert config["peak_lr"] == pytest.approx(0.025)  # the linear rule, as in the PyTorch engine
    assert summary["type"] == "summary" and summary["ranks_agree"]
    assert len(summary["weights_digests"]) == 2


# MultiWorkerMirroredStrategy with two workers and the TF-vs-PyTorch benchmark (read by the
# thesis's own log reader) are asserted by chapter 8 itself, which the book build executes once.


@pytest.mark.slow
def test_a_rerun_resumes_from_the_checkpoint(tmp_path):
    first = subprocess.run([*TRAIN_TF, "--epochs", "2", "--results-dir", "r", "--checkpoint-dir", "ck"],
                           capture_output=True, text=True, timeout=TIMEOUT, env=child_env(**TF_QUIET), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    second = subprocess.run([*TRAIN_TF, "--epochs", "3", "--results-dir", "r", "--checkpoint-dir", "ck"],
                            capture_output=True, text=True, timeout=TIMEOUT, env=child_env(**TF_QUIET), cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resuming at epoch 2" in second.stdout
    lines = _lines(tmp_path / "r")  # one record, continued
    assert [line["epoch"] for line in lines if line["type"] == "epoch"] == [1, 2, 3]
    assert any(line["type"] == "resume" for line in lines)
    summary = [line for line in lines if line["type"] == "summary"][-1]
    assert summary["best_val_top1_err"] == min(line["val_top1_err"] for line in lines if line["type"] == "epoch")


@pytest.mark.parametrize("args, message", [
    (["--model", "alexnet9"], "unknown model 'alexnet9' for TensorFlow"),
    (["--per-worker-batch", "0"], "--per-worker-batch must be a positive integer"),
    (["--dist", "ddp"], "argument --dist: invalid choice: 'ddp'"),
    (["--channels-last"], "--channels-last applies to the PyTorch engine only"),
    (["--accumulate-steps", "2"], "--accumulate-steps is not implemented in the TensorFlow door; train with python "
                                  "-m guide_utils.train, or drop it and pass --per-worker-batch 64"),
])
def test_bad_input_is_one_line(tmp_path, args, message):
    # the process reports whether TensorFlow was loaded: a wrong flag must not wait for it
    code = ("import sys\nfrom guide_utils import train_tf\ntry:\n    sys.exit(train_tf.main(sys.argv[1:]))\n"
            "finally:\n    print('tensorflow loaded:', 'tensorflow' in sys.modules)")
    proc = subprocess.run([PY, "-c", code, *TRAIN_TF[3:], *args, "--results-dir", "r"], capture_output=True,
                          text=True, timeout=TIMEOUT, env=child_env(**TF_QUIET), cwd=tmp_path)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert "tensorflow loaded: False" in proc.stdout


def _start(cwd: Path, argvs: list[list[str]], envs: list[dict[str, str]]) -> list[subprocess.Popen]:
    """Start one process per command line, each in its own session; output goes to files (a
    pipe that nobody reads yet can fill up and stall a worker)."""
    procs = []
    for argv, env in zip(argvs, envs):
        n = len(list(cwd.glob("*.out")))
        out, err = open(cwd / f"{n}.out", "w+"), open(cwd / f"{n}.err", "w+")
        procs.append(subprocess.Popen(argv, env=child_env(**TF_QUIET, **env), cwd=cwd, stdout=out, stderr=err,
                                      start_new_session=True))
        procs[-1].files = (out, err)
    return procs


def _finish(procs: list[subprocess.Popen], timeout: float = TIMEOUT) -> list[tuple[int, str, str]]:
    """Wait for every process (those still running after ``timeout`` are killed, with what
    they started): (exit status, stdout, stderr) each."""
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        pass
    results = []
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        texts = []
        for f in p.files:
            f.seek(0)
            texts.append(f.read())
            f.close()
        results.append((p.returncode, *texts))
    return results


def _mwms(cwd: Path, *args: str) -> list[subprocess.Popen]:
    """Two MultiWorkerMirroredStrategy workers on loopback, as chapter 8 starts them (TF_CONFIG)."""
    return _start(cwd, [[*TRAIN_TF, *SHORT, "--dist", "mwms", *args]] * 2, tf_config(2))


def _signal_once_saved(procs: list[subprocess.Popen], checkpoint: Path, pid: int) -> None:
    """SIGUSR1 to ``pid`` (one worker only) as soon as the first epoch's checkpoint exists."""
    deadline = time.monotonic() + TIMEOUT
    while not (checkpoint / "ckpt-1.index").exists():
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), _finish(procs, 0)
        time.sleep(0.05)
    os.kill(pid, signal.SIGUSR1)


def _epochs(lines: list[dict]) -> list[dict]:
    return [line for line in lines if line["type"] == "epoch"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_mwms_stopped_by_a_signal_resumes_like_an_unbroken_run(tmp_path):
    """Two MWMS workers with --checkpoint-dir; worker 1 alone gets SIGUSR1 once epoch 1 is
    saved. Both stop and exit 75, the rerun resumes at the saved epoch, and it ends with the
    unbroken run's weights and training metrics exactly (each epoch's order comes from the
    seed and the epoch; two CPU workers on one machine add in the same order every time).
    Validation differs a little: BatchNorm's moving statistics are per worker between saves,
    and a checkpoint keeps their mean over the workers (MWMS's ON_READ/MEAN variables)."""
    unbroken = _finish(_mwms(tmp_path, "--epochs", "3", "--results-dir", "u"))
    assert [rc for rc, _, _ in unbroken] == [0, 0], unbroken[0][2][-3000:]
    stopped = _mwms(tmp_path, "--epochs", "4", "--results-dir", "r", "--checkpoint-dir", "ck")
    _signal_once_saved(stopped, tmp_path / "ck", stopped[1].pid)
    (rc0, out0, err0), (rc1, _, _) = _finish(stopped)
    assert (rc0, rc1) == (75, 75), err0[-3000:]
    assert "stop requested (a signal to another worker)" in out0
    saved = max(int(p.stem.split("-")[1]) for p in (tmp_path / "ck").glob("ckpt-*.index"))
    assert saved in (1, 2) and not list((tmp_path / "ck").glob("workertemp_*"))  # stopped in or after epoch 2
    assert [line["type"] for line in _lines(tmp_path / "r")][-1] == "preempted"  # no summary yet
    resumed = _finish(_mwms(tmp_path, "--epochs", "3", "--results-dir", "r", "--checkpoint-dir", "ck"))
    assert [rc for rc, _, _ in resumed] == [0, 0], resumed[0][2][-3000:]
    assert f"resuming at epoch {saved}" in resumed[0][1]
    lines, reference = _lines(tmp_path / "r"), _lines(tmp_path / "u")
    assert [line["epoch"] for line in _epochs(lines)] == [1, 2, 3]  # one record, a stopped epoch not in it
    assert lines[-1]["weights_digests"] == reference[-1]["weights_digests"]
    for got, want in zip(_epochs(lines), _epochs(reference)):
        assert (got["loss"], got["train_top1_err"]) == (want["loss"], want["train_top1_err"])
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-3)
        assert got["val_top1_err"] == pytest.approx(want["val_top1_err"], abs=0.5)  # 4 of 800 samples


@pytest.mark.slow
@pytest.mark.multiprocess
def test_horovod_workers_stop_together_when_one_is_signalled(tmp_path):
    """Under mpirun, SIGUSR1 to rank 1 alone: the ranks agree by allreduce, stop, and exit 75
    with epoch 1's checkpoint on disk (the resume itself is the single-process test's)."""
    mpirun = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"]
    (launcher,) = _start(tmp_path, [[*mpirun, *TRAIN_TF, *SHORT, "--dist", "horovod", "--epochs", "4",
                                     "--results-dir", "r", "--checkpoint-dir", "ck"]], [{}])
    deadline = time.monotonic() + TIMEOUT
    while (rank1 := _child_with(launcher.pid, b"OMPI_COMM_WORLD_RANK=1")) is None:
        assert time.monotonic() < deadline and launcher.poll() is None, _finish([launcher], 0)
        time.sleep(0.05)
    _signal_once_saved([launcher], tmp_path / "ck", rank1)
    ((rc, out, err),) = _finish([launcher])
    assert rc == 75, err[-3000:]
    assert "stop requested (a signal to another worker)" in out
    assert (tmp_path / "ck" / "ckpt-1.index").exists()
    lines = _lines(tmp_path / "r")
    assert lines[-1]["type"] == "preempted" and lines[-1]["epoch"] in (1, 2)


def _child_with(parent: int, variable: bytes) -> int | None:
    """The process id of ``parent``'s child whose environment has ``variable`` (NAME=value)."""
    for proc in Path("/proc").iterdir():
        try:
            if (proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent
                    and variable in (proc / "environ").read_bytes().split(b"\0")):
                return int(proc.name)
        except OSError:  # gone meanwhile
            continue
    return None
