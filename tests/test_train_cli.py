"""Bad input to ``python -m guide_utils.train``: one clear line, exit 2, no traceback, no file lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_image_tree

PY = sys.executable
TRAIN = [PY, "-m", "guide_utils.train", "--profile", "smoke", "--no-progress", "--epochs", "1"]


LAUNCHER_VARS = ("SLURM_", "OMPI_", "PMI", "HOROVOD_", "RANK", "WORLD_SIZE", "TORCHELASTIC")


def _fails_with_one_line(args: list[str], cwd: Path, *expected: str) -> str:
    """A real ``python -m guide_utils.train`` process: exit 2, one line, no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)}
    proc = subprocess.run([*TRAIN, *args], capture_output=True, text=True, timeout=180, cwd=cwd, env=env)
    return _one_line(proc.returncode, proc.stdout, proc.stderr, expected)


def _one_line(code: int, out: str, err: str, expected) -> str:
    assert code == 2, f"exit {code}\nstdout: {out}\nstderr: {err}"
    assert "Traceback" not in err + out
    err = err.strip()
    assert len(err.splitlines()) == 1, f"expected one line, got:\n{err}"
    for word in expected:
        assert word in err, f"{word!r} not in {err!r}"
    return err


@pytest.fixture
def train_main(monkeypatch, tmp_path, capsys):
    """The same command in this process (no interpreter start, no torch import per case):
    its exit status and output are what the process would give, and an exception other than
    the guide's one-line errors would fail the test as it would show a traceback."""
    import signal

    from guide_utils.train import main

    for name in [k for k in os.environ if k.startswith(LAUNCHER_VARS)]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the engine leaves torch's threads alone
    monkeypatch.chdir(tmp_path)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}

    def run(args: list[str], *expected: str) -> str:
        try:
            code = main([*TRAIN[3:], *args])
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
        finally:
            for sig, handler in handlers.items():  # the CLI catches them early; give them back
                signal.signal(sig, handler)
        captured = capsys.readouterr()
        return _one_line(code, captured.out, captured.err, expected)

    return run


CASES = {
    "unknown model": (["--model", "resnet5000"], ["resnet5000"]),
    "unknown flag": (["--learning-rate", "0.1"], ["--learning-rate"]),
    "unknown warmup": (["--warmup", "slow"], ["--warmup"]),
    "batch zero": (["--per-worker-batch", "0"], ["--per-worker-batch", "0"]),
    "negative batch": (["--per-worker-batch", "-8"], ["--per-worker-batch"]),
    "zero epochs": (["--epochs", "0"], ["--epochs"]),
    "warmup past first milestone": (["--warmup", "gradual", "--warmup-epochs", "3", "--milestones", "2", "3"],
                                    ["--warmup-epochs 3", "milestone 2"]),
    "horovod without launcher": (["--dist", "horovod"], ["horovodrun", "mpirun"]),
    "ddp without launcher": (["--dist", "ddp"], ["torchrun"]),
    "fp16 on cpu": (["--amp", "fp16"], ["fp16", "bf16"]),
    "negative loader workers": (["--loader-workers", "-1"], ["--loader-workers"]),
    "batch larger than the data": (["--per-worker-batch", "100000"], ["--per-worker-batch 100000"]),
    "not a number": (["--base-lr", "fast"], ["--base-lr"]),
    "missing dataset": (["--data", "no/such/dir", "--model", "small_resnet"], ["no/such/dir"]),
    "warmup start batch zero": (["--warmup-start-batch", "0"], ["--warmup-start-batch", "0"]),
    "accumulate steps zero": (["--accumulate-steps", "0"], ["--accumulate-steps must be a positive integer", "0"]),
    "negative accumulate steps": (["--accumulate-steps", "-2"], ["--accumulate-steps", "-2"]),
    # 3200 training samples: 32 x 200 accumulated is 6400 per step, the data cannot fill one
    "accumulated step larger than the data": (["--accumulate-steps", "200"],
                                              ["one optimizer step of 200 x 32 = 6400", "--accumulate-steps 200"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input(case, train_main):
    args, expected = CASES[case]
    train_main(args, *expected)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["unknown flag", "missing dataset", "warmup past first milestone"])
def test_bad_input_as_a_real_process(case, tmp_path):
    args, expected = CASES[case]
    _fails_with_one_line(args, tmp_path, *expected)


@pytest.mark.slow
def test_empty_dataset_dir(tmp_path):
    (tmp_path / "data").mkdir()
    _fails_with_one_line(["--data", "data", "--model", "small_resnet"], tmp_path, "data")


@pytest.mark.slow
def test_image_folder_without_val(tmp_path):
    make_image_tree(tmp_path / "imgs", splits=("train",))
    _fails_with_one_line(["--data", "imgs", "--model", "small_resnet", "--image-size", "16"], tmp_path, "val")


@pytest.mark.slow
def test_image_model_on_1d_data(tmp_path):
    _fails_with_one_line(["--model", "resnet18"], tmp_path, "resnet18", "mnist1d")


@pytest.mark.slow
def test_unwritable_checkpoint_dir(tmp_path):
    (tmp_path / "file.txt").write_text("a user's file")
    _fails_with_one_line(["--checkpoint-dir", "file.txt/ckpt"], tmp_path, "file.txt/ckpt", "--checkpoint-dir")
    assert (tmp_path / "file.txt").read_text() == "a user's file"


@pytest.mark.slow
def test_corrupt_checkpoint_is_reported_not_deleted(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "checkpoint-epoch0001.pt").write_bytes(b"not a checkpoint")
    _fails_with_one_line(["--checkpoint-dir", "ckpt"], tmp_path, "ckpt")
    assert (ckpt / "checkpoint-epoch0001.pt").read_bytes() == b"not a checkpoint"


@pytest.mark.slow
def test_checkpoint_from_a_different_model(tmp_path):
    base = [PY, "-m", "guide_utils.train", "--profile", "smoke", "--no-progress", "--epochs", "1",
            "--checkpoint-dir", "ckpt", "--data", "synthetic", "--image-size", "16", "--synthetic-size", "64"]
    first = subprocess.run([*base, "--model", "small_resnet"], capture_output=True, text=True, cwd=tmp_path, timeout=180)
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()}
    second = subprocess.run([*base, "--model", "resnet18"], capture_output=True, text=True, cwd=tmp_path, timeout=180)
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert "small_resnet" in second.stderr and "resnet18" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr
    assert {p.name: p.read_bytes() for p in (tmp_path / "ckpt").iterdir()} == before


@pytest.mark.slow
def test_an_existing_record_is_never_overwritten(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "mine.jsonl").write_text("my notes\n")
    ok = subprocess.run([*TRAIN, "--run-name", "mine", "--results-dir", "results"], capture_output=True,
                        text=True, cwd=tmp_path, timeout=180)
    assert ok.returncode == 0, ok.stderr
    assert (results / "mine.jsonl").read_text() == "my notes\n"
    assert (results / "mine-2.jsonl").exists()


def test_help_documents_every_flag():
    import dataclasses

    from guide_utils.core.config import TrainConfig
    from guide_utils.train import build_parser

    text = build_parser().format_help()
    for field in dataclasses.fields(TrainConfig):
        if field.name in ("extra", "throughput_warmup_iters"):
            continue
        flag = "--no-progress" if field.name == "progress" else "--" + field.name.replace("_", "-")
        assert flag in text, f"{flag} missing from --help"


# Inside an sbatch script the batch step itself has SLURM_PROCID=0 (but no SLURM_STEP_ID),
# which once passed for "started by srun": Horovod then trained alone and DDP waited for
# ranks that never came. tests/test_slurm_examples.py checks the same on the real Slurm.
BATCH_STEP = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS": "4",
              "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
SRUN_STEP_WITHOUT_MPI = {**BATCH_STEP, "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4",
                         "SLURM_STEP_NODELIST": "n[1-2]"}


@pytest.mark.slow
@pytest.mark.parametrize("dist, env, expected", [
    ("horovod", BATCH_STEP, ["batch script of job 4242", "would train alone", "srun --mpi=pmix"]),
    ("ddp", BATCH_STEP, ["batch script of job 4242", "would wait for ranks", "srun or torchrun"]),
    ("horovod", SRUN_STEP_WITHOUT_MPI, ["srun started 4 tasks without an MPI plugin", "--mpi=pmix"]),
], ids=["horovod-in-batch-script", "ddp-in-batch-script", "horovod-under-srun-without-mpi"])
def test_dist_without_a_launcher_inside_a_job(tmp_path, dist, env, expected):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI", "HOROVOD_"))},
           **env}
    proc = subprocess.run([*TRAIN, "--dist", dist], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for word in expected:
        assert word in proc.stderr
    assert not (tmp_path / "results").exists(), "nothing may be trained or recorded"


def test_launcher_detection():
    from guide_utils.runtime.launch import started_by

    assert started_by({}) is None
    assert started_by(BATCH_STEP) is None
    assert started_by(SRUN_STEP_WITHOUT_MPI) == "srun"
    assert started_by({**SRUN_STEP_WITHOUT_MPI, "PMIX_RANK": "3"}) == "mpirun"  # srun --mpi=pmix
    assert started_by({**BATCH_STEP, "OMPI_COMM_WORLD_RANK": "1"}) == "mpirun"
    assert started_by({"HOROVOD_RANK": "0", "OMPI_COMM_WORLD_RANK": "0"}) == "horovodrun"
    assert started_by({"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}) == "torchrun"


def test_the_full_profile_never_guesses_its_dataset(train_main, tmp_path):
    """Without --data the full profile used to train on random images, silently: a cluster
    job whose dataset was never set ran for days and learned nothing. Synthetic data is
    now asked for by name; without a dataset the run stops before it starts."""
    from guide_utils.core.config import make_config

    err = train_main(["--profile", "full"], "no dataset", "--data DIR", "prepare-imagenet", "--data synthetic")
    assert err.startswith("python -m guide_utils.train: error: no dataset: the full profile trains on ImageNet")
    assert not (tmp_path / "results").exists()
    assert make_config("full", data="synthetic").validate().data == "synthetic"
    assert make_config("smoke").validate().data == "mnist1d"  # the smoke profile's own data is unchanged
