"""The reader's own script (examples/your_script, chapter 16): plain files that import nothing
from guide_utils; each distributed version a diff of its single-GPU script within the line
budget the chapter states; run by the launchers check-script does not start (srun's tasks,
mpirun) with two workers here, it follows the library's schedule (``lr_at``), ends with the
same weights on every rank, and after Slurm's warning to one rank stops, saves, exits 75 and
resumes to the weights of an unbroken run (torchrun and horovodrun: test_check_script.py).
The batch script that runs such a command (16_your_own_script.sbatch) refuses bad input in
one line here, and runs on the test Slurm in test_slurm_examples.py."""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import BIN, MPI_AS_ROOT, child_env
from guide_utils.results import your_script

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "your_script"
SBATCH = REPO / "slurm_examples" / "16_your_own_script.sbatch"
PY = sys.executable
TIMEOUT = 300
# 10 epochs of 12 steps: a 2-epoch gradual warmup, the peak, a tenfold drop at epoch 6; long
# enough that a warning sent after the first epoch arrives well before the end.
RUN = {"lr": 0.05, "steps_per_epoch": 12, "warmup_epochs": 2, "milestones": (6,)}
EPOCHS = 10
ARGS = ["--epochs", str(EPOCHS), "--steps-per-epoch", "12", "--warmup-epochs", "2", "--milestones", "6",
        "--log-every", "1", "--checkpoint", "ckpt"]
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", **MPI_AS_ROOT}
MPIRUN = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", "-x", "PATH", "-x", "OMP_NUM_THREADS",
          "-x", "PYTHONUNBUFFERED", "-x", "TF_CPP_MIN_LOG_LEVEL"]
# Each version's launcher for the unbroken run, and for the run that is warned and resumed:
# the launchers check-script does not start (srun's tasks, mpirun), and the Keras version,
# which it does not check. Under torchrun and horovodrun every PyTorch version is warned,
# resumed and compared with its unbroken run in tests/test_check_script.py.
LAUNCHERS = {"train_ddp.py": ("torchrun", "srun"), "train_horovod.py": (None, "mpirun"),
             "keras_train_horovod.py": ("horovodrun", "mpirun")}
# The unbroken run each resumed run must match. The PyTorch versions of a script share one:
# Horovod and DDP average the same gradients of the same samples, so they train the same
# model (chapter 2 shows it for the engine; with two workers the averages are equal to the
# last bit).
REFERENCE = {"train_ddp.py": "train_ddp.py", "train_horovod.py": "train_ddp.py",
             "keras_train_horovod.py": "keras_train_horovod.py"}
SHAPE = {"args": ARGS, "run": RUN, "epoch_done": r"epoch \d+/"}


def _shape(name: str) -> dict:
    """How a version is run and checked: its flags, its schedule, what ends an epoch."""
    return SHAPE


# -- The files -----------------------------------------------------------------------------------

def test_the_examples_import_nothing_from_the_guide():
    for path in sorted(EXAMPLES.glob("*.py")):
        tree = ast.parse(path.read_text())
        names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
        names += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] == "guide_utils"], f"{path.name} imports guide_utils"
    assert {p.name for p in EXAMPLES.glob("*.py")} == set(your_script.VERSIONS) | set(your_script.VERSIONS.values())


def test_every_version_stays_within_the_line_budget_and_every_change_has_its_idea():
    """The chapter's promise, from the same module the chapter computes it with."""
    for name in your_script.VERSIONS:
        n = your_script.count(name)
        assert 0 < n <= your_script.LINE_BUDGET, f"{name}: {n} changed code lines, budget {your_script.LINE_BUDGET}"
        assert your_script.unclaimed(name) == [], name
    for names in (your_script.FIRST, your_script.SHAPES):
        table = your_script.counts(names)
        assert (table.loc["total"] == [your_script.count(name) for name in names]).all()


def test_what_the_single_gpu_script_defines_the_versions_keep_as_it_is():
    """Data, model, digest and checkpoint format are the single-GPU script's own, line for
    line: a version differs only where scaling out needs it."""
    for name, single in your_script.VERSIONS.items():
        mine = {node.name: ast.dump(node) for node in ast.parse((EXAMPLES / name).read_text()).body
                if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        for node in ast.parse((EXAMPLES / single).read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name not in your_script.LOOP[single]:
                assert mine.get(node.name) == ast.dump(node), f"{name} changed {node.name} of {single}"


def test_the_examples_pass_ruff_at_the_books_width():
    proc = subprocess.run([str(BIN / "ruff"), "check", "--no-cache", "--output-format", "concise", "examples"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_rendered_diff_of_an_idea_is_the_files_own():
    lines = your_script.diff_text("train_ddp.py", "data").splitlines()
    assert any(line.startswith("+        sampler.set_epoch(epoch)") for line in lines)
    assert "-    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True," in lines
    assert not [line for line in lines if "SystemExit" in line or "warmup" in line]  # other ideas' lines
    old = (EXAMPLES / "train.py").read_text().splitlines()
    new = (EXAMPLES / "train_ddp.py").read_text().splitlines()
    assert all(line[1:] in new for line in lines[2:] if line[:1] in "+ ")
    assert all(line[1:] in old for line in lines[2:] if line[:1] == "-")


# -- The batch script, outside Slurm ---------------------------------------------------------------

def _bash(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", script, *args], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "GUIDE_ROOT": str(REPO), "GUIDE_SITE": "ci", **env})


@pytest.mark.parametrize("args, env, message", [
    ((), {}, "error: no training command given; put it after the script, e.g. sbatch "
             "slurm_examples/16_your_own_script.sbatch -- python examples/your_script/train_ddp.py"),
    (("--",), {}, "error: no training command given"),
    (("--", "python", "x.py"), {"LAUNCHER": "pdsh"},
     "error: LAUNCHER=pdsh: choose srun, torchrun, mpirun or horovodrun"),
    (("python", "x.py"), {"LAUNCHER": "torchrun", "DIST": "horovod"},
     "error: LAUNCHER=torchrun starts PyTorch DDP processes only"),
    (("python", "x.py"), {"FRAMEWORK": "jax"}, "error: FRAMEWORK=jax: choose pytorch or tensorflow"),
    (("python", "-W", "ignore", "x.py"), {"LAUNCHER": "torchrun", "DIST": "ddp"},
     "error: LAUNCHER=torchrun starts python itself (with -u) and cannot pass it '-W'"),
    (("torchrun", "--nproc-per-node=4", "x.py"), {}, "error: the command starts torchrun itself: give the training "
                                                      "command alone"),
    (("bash", "-c", "python x.py"), {},
     "error: 'bash -c CODE': the time-limit warning finds your program by its script"),
], ids=["nothing", "only --", "unknown launcher", "torchrun horovod", "unknown framework", "torchrun python flag",
        "a launcher in the command", "code as a string"])
def test_bad_input_to_the_batch_script_is_one_line(args, env, message):
    proc = _bash(str(SBATCH), *args, **env)
    assert proc.returncode == 2 and proc.stdout == "", proc
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(message), line


def test_the_warning_reaches_the_readers_program_and_not_its_launcher():
    """guide_command_match: the processes that run the command's program as srun, torchrun,
    horovodrun and mpirun start them, for a plain `python SCRIPT`, a shell wrapper (`bash
    train.sh`: the shell, which lib/signal_node.sh looks through to the program it runs) and a
    wrapper that execs (`./select_gpu python train.py`: the Python it becomes); never the
    launchers, the batch shell, the scratch holder or the scan (torchrun dies of a USR1)."""
    def match(*command: str) -> str:
        proc = subprocess.run(["bash", "-c", 'source "$0"; guide_command_match "$@"',
                               str(REPO / "slurm_examples/lib/guide.sh"), *command],
                              capture_output=True, text=True, timeout=60, env={**os.environ, "GUIDE_ROOT": str(REPO)})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    script = match("python", "examples/your_script/train_ddp.py", "--epochs", "3")
    module = match("python", "-m", "my.train", "--epochs", "3")
    program = match("./bin/train+gpu", "-x")
    wrapper = match("bash", "train.sh", "--epochs", "3")
    execs = match("./select_gpu", "python", "train.py", "--epochs", "3")
    hrun = "/bin/sh -c cd /w > /dev/null 2>&1 ; HOROVOD_RANK=0 "  # horovodrun's shell around each worker
    cmdlines = {  # as /proc/PID/cmdline reads, arguments joined by spaces
        "/v/bin/python -u examples/your_script/train_ddp.py --epochs 3 ": (script, True),  # torchrun's worker
        "python examples/your_script/train_ddp.py --epochs 3 ": (script, True),  # srun's task, horovodrun's worker
        "/v/bin/python /v/bin/torchrun --nnodes=2 examples/your_script/train_ddp.py --epochs 3 ": (script, False),
        "/v/bin/python /v/bin/horovodrun --gloo -np 2 python examples/your_script/train_ddp.py ": (script, False),
        f"{hrun}python examples/your_script/train_ddp.py --epochs 3 ": (script, False),
        "mpirun -np 4 python examples/your_script/train_ddp.py ": (script, False),
        "python examples/your_script/train_ddp.pyc ": (script, False),
        "/usr/bin/python3.11 -u -m my.train --epochs 3 ": (module, True),
        "python -m my_train ": (module, False),
        "/opt/x/bin/train+gpu -x ": (program, True),
        "/usr/bin/python3 ./bin/train+gpu -x ": (program, True),  # a script run by its #! line
        "srun ./bin/train+gpu -x ": (program, False),
        # bash train.sh: srun's task, torchrun's worker (--no-python) and horovodrun's are the same
        "bash train.sh --epochs 3 ": (wrapper, True),
        "/usr/bin/bash ./train.sh --epochs 3 ": (wrapper, True),
        f"{hrun}bash train.sh --epochs 3 ": (wrapper, False),
        "/v/bin/python /v/bin/torchrun --nnodes=2 --no-python bash train.sh --epochs 3 ": (wrapper, False),
        "/bin/bash /var/spool/slurmd/job00077/slurm_script bash train.sh --epochs 3 ": (wrapper, False),  # batch shell
        "bash /r/slurm_examples/lib/stage_node.sh hold /tmp/guide-77 ": (wrapper, False),  # the scratch holder
        "bash /r/slurm_examples/lib/signal_node.sh USR1 77 ^x guide-n1:9 ": (wrapper, False),  # the scan
        "python train.py --epochs 3 ": (wrapper, False),  # what train.sh runs: found as its child instead
        # ./select_gpu python train.py, once the wrapper has exec'd (under any launcher), and before
        "python train.py --epochs 3": (execs, True),
        "/v/bin/python3 -u train.py --epochs 3 ": (execs, True),
        "/bin/bash ./select_gpu python train.py --epochs 3 ": (execs, False),
        f"{hrun}./select_gpu python train.py --epochs 3 ": (execs, False),
        "/v/bin/python /v/bin/torchrun --no-python ./select_gpu python train.py ": (execs, False),
    }
    for line, (pattern, expected) in cmdlines.items():
        assert bool(re.search(pattern, line)) == expected, (pattern, line)
    # The guide's own scripts keep their default, the engine's processes (tests/test_slurm_scripts.py).
    assert '"${GUIDE_SIGNAL_MATCH:-$GUIDE_ENGINE_MATCH}"' in (REPO / "slurm_examples/lib/guide.sh").read_text()


# -- Two workers under their launchers ------------------------------------------------------------

def _command(launcher: str, name: str) -> list[str]:
    script = str(EXAMPLES / name)
    if launcher == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("mpirun not found: sudo apt-get install -y openmpi-bin libopenmpi-dev")
    start = {"horovodrun": [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", PY],
             "mpirun": [*MPIRUN, PY],
             "torchrun": [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"],
             "srun": [PY]}[launcher]
    return [*start, script, *_shape(name)["args"]]


def _srun_env(cwd: Path) -> list[dict[str, str]]:
    """What srun gives each of two tasks on one node (no torchrun variables), and a scontrol
    that fails as it does in a container without Slurm's configuration (the example expands
    the node list with python-hostlist); the job id maps to a free rendezvous port."""
    (cwd / "bin").mkdir(exist_ok=True)
    (cwd / "bin" / "scontrol").write_text('#!/bin/sh\necho "scontrol: error: no slurm.conf" >&2; exit 1\n')
    (cwd / "bin" / "scontrol").chmod(0o755)
    job_id = next(port - 20000 for port in range(20000 + os.getpid() % 9000, 30000) if _free(port))
    return [{"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NTASKS": "2", "SLURM_JOB_ID": str(job_id),
             "SLURM_STEP_NODELIST": "localhost", "PATH": f"{cwd / 'bin'}{os.pathsep}{child_env()['PATH']}"}
            for rank in (0, 1)]


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _start(launcher: str, name: str, cwd: Path) -> list[subprocess.Popen]:
    """The run's processes (one launcher, or the two "srun tasks"), output to files."""
    cwd.mkdir(parents=True, exist_ok=True)
    envs = _srun_env(cwd) if launcher == "srun" else [{}]
    procs = []
    for i, extra in enumerate(envs):
        env = child_env(**QUIET, **extra)
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(var, None)
        out = open(cwd / f"out{i}.txt", "w")
        procs.append(subprocess.Popen(_command(launcher, name), cwd=cwd, env=env, stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True))
        procs[-1].out = out
    return procs


def _output(procs: list[subprocess.Popen]) -> str:
    # Read through a file object of our own: seeking the one the process writes through would
    # move the offset it shares with the process, whose next writes then overwrite the start
    # of its output (lines the test waits for could vanish).
    return "\n".join(Path(p.out.name).read_text() for p in procs)


def _finish(procs: list[subprocess.Popen], timeout: float = TIMEOUT) -> tuple[list[int], str]:
    """Wait for the run (kill what is left after ``timeout``): exit statuses and all output."""
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    text = _output(procs)
    for p in procs:
        p.out.close()
    return [p.returncode for p in procs], text


def _rank_pid(procs: list[subprocess.Popen], rank: int) -> int:
    """The process id of training rank ``rank`` (a launcher's child, or a task started here)."""
    import psutil

    if len(procs) > 1:
        return procs[rank].pid
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and procs[0].poll() is None:
        for child in psutil.Process(procs[0].pid).children(recursive=True):
            try:
                env = child.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if any(env.get(v) == str(rank) for v in ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "RANK")):
                return child.pid
        time.sleep(0.05)
    pytest.fail(f"rank {rank} never started:\n{_finish(procs, 0)[1][-3000:]}")


def _check_schedule(text: str, run: dict) -> None:
    lrs = your_script.printed_lrs(text)
    assert lrs, text[-3000:]
    for step, lr in lrs.items():
        assert lr == pytest.approx(your_script.expected_lr(step, workers=2, **run), rel=1e-8), step


_UNBROKEN: dict[str, str] = {}


def _unbroken(name: str, tmp_path: Path) -> str:
    """The final weights' digest of an unbroken two-worker run (run once per session)."""
    if name not in _UNBROKEN:
        codes, text = _finish(_start(LAUNCHERS[name][0], name, tmp_path / "unbroken"))
        assert set(codes) == {0}, text[-3000:]
        digests = your_script.printed_digests(text)
        assert sorted(digests) == [0, 1] and len(set(digests.values())) == 1, text[-3000:]
        _check_schedule(text, _shape(name)["run"])
        assert sorted(your_script.printed_lrs(text)) == list(range(EPOCHS * _shape(name)["run"]["steps_per_epoch"]))
        _UNBROKEN[name] = digests[0]
    return _UNBROKEN[name]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", sorted(set(REFERENCE.values())))
def test_two_workers_follow_the_schedule_and_agree(name, tmp_path):
    """Every step's learning rate is lr_at's (linear rule, gradual warmup from the one-GPU
    rate, the drop), and both ranks end with the same weights. (The Horovod PyTorch version
    is held to the same in the next test.)"""
    assert re.fullmatch(r"[0-9a-f]{16}", _unbroken(name, tmp_path))


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", list(LAUNCHERS))
def test_a_warned_run_stops_saves_and_resumes_to_the_unbroken_weights(name, tmp_path):
    """SIGUSR1 to rank 1 alone once the first epoch is done: the ranks agree to stop at the same
    step, rank 0 saves, both exit 75; the rerun resumes mid-epoch and ends with the weights of
    the unbroken run (started by another launcher; for Horovod's PyTorch version, DDP's)."""
    launcher, shape = LAUNCHERS[name][1], _shape(name)
    procs = _start(launcher, name, tmp_path / "warned")
    rank1 = _rank_pid(procs, 1)
    deadline = time.monotonic() + TIMEOUT
    while not re.search(shape["epoch_done"], _output(procs)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), _finish(procs, 0)[1][-3000:]
        time.sleep(0.02)
    os.kill(rank1, signal.SIGUSR1)
    codes, text = _finish(procs)
    if launcher in ("torchrun", "horovodrun"):  # each reports a worker's 75 as its own 1 (the sbatch copes)
        assert codes == [1] and re.search(r"exitcode\s*:\s*75|exit with status code 75", text), \
            f"{codes}\n{text[-3000:]}"
    else:
        assert set(codes) == {75}, f"{codes}\n{text[-3000:]}"
    assert len(re.findall(shape["epoch_done"], text)) < EPOCHS, text[-3000:]
    assert list((tmp_path / "warned").glob("ckpt*")), text[-3000:]
    codes, text = _finish(_start(launcher, name, tmp_path / "warned"))
    assert set(codes) == {0}, text[-3000:]
    (resumed_at,) = map(int, re.findall(r"resuming from ckpt at step (\d+)", text))
    steps = shape["run"]["steps_per_epoch"]
    # every 10 steps, or after an epoch's end-of-epoch work when the warning came on its last step
    assert (resumed_at % 10 == 0 or resumed_at % steps == 0) and steps <= resumed_at < EPOCHS * steps
    _check_schedule(text, shape["run"])
    digests = your_script.printed_digests(text)
    assert sorted(digests) == [0, 1] and set(digests.values()) == {_unbroken(REFERENCE[name], tmp_path)}, \
        text[-3000:]
