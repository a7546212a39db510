"""The TensorFlow door on CPU: Horovod over Gloo and MPI, MultiWorkerMirroredStrategy, the
schedule, resume, the benchmark, the version guard and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BIN, MPI_AS_ROOT, child_env
from guide_utils.core.errors import GuideError
from guide_utils.core.schedules import lr_at
from guide_utils.tensorflow.runtime import check_versions

PY = sys.executable
REPO = Path(__file__).resolve().parents[1]
TRAIN_TF = [PY, "-m", "guide_utils.train_tf", "--profile", "smoke"]
TIMEOUT = 300
TF_QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", **MPI_AS_ROOT}  # TensorFlow's C++ start-up chatter off


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
])
def test_bad_input_is_one_line(tmp_path, args, message):
    proc = subprocess.run([*TRAIN_TF, *args, "--results-dir", "r"], capture_output=True, text=True,
                          timeout=TIMEOUT, env=child_env(**TF_QUIET), cwd=tmp_path)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
