"""The doctor per task: probes built from the environments Slurm gives its tasks (GRES device
lists per step or per task, CPU sets as task/affinity binds them), judged together; the real
probe of this process; the two commands end to end; and the engine taking the GPU the
check judges."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import slurm_cluster
from guide_utils.cluster.doctor import tasks
from guide_utils.cluster.doctor.tasks import diagnose, local_probes, probe, read_probes, render
from guide_utils.runtime.gpus import device_index, visible_devices

JOB = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_STEP_ID": "0"}


def task(node: str, procid: int, localid: int, cpus, cpus_per_task: str | None = "2", **env) -> dict:
    """The probe of task ``procid`` of an srun step, in the environment Slurm gives it, bound
    to ``cpus`` (what os.sched_getaffinity says inside that task)."""
    base = {**JOB, "SLURMD_NODENAME": node, "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(localid)}
    if cpus_per_task is not None:
        base["SLURM_CPUS_PER_TASK"] = cpus_per_task
    return dict(probe({**base, **env}), cpus=sorted(cpus))


def node_of(n: int, per_task=None, cpus_each: int = 2, node: str = "n1", first: int = 0, **env) -> list[dict]:
    """``n`` tasks on one node with their own CPUs; ``per_task(i)``: the env of task i."""
    return [task(node, first + i, i, range(cpus_each * i, cpus_each * (i + 1)),
                 **env, **(per_task(i) if per_task else {})) for i in range(n)]


# --- the shared GPU rule ---------------------------------------------------------------------

def test_the_first_device_list_set_wins_and_empty_hides_all():
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "0,1", "ROCR_VISIBLE_DEVICES": "3"}) == ["0", "1"]
    assert visible_devices({"ROCR_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert visible_devices({"HIP_VISIBLE_DEVICES": "1"}) == ["1"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": "0"}) == []
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == []
    assert visible_devices({"SLURM_JOB_GPUS": "0"}) is None
    assert [device_index(r, 3) for r in range(5)] == [0, 1, 2, 0, 1]
    with pytest.raises(ValueError):
        device_index(0, 0)


def test_the_engine_takes_the_gpu_the_check_judges(monkeypatch):
    torch = pytest.importorskip("torch")
    from guide_utils.engine import distributed

    calls, chosen = [], []

    def spy(local_rank, count):
        calls.append((local_rank, count))
        return device_index(local_rank, count)

    monkeypatch.setattr(distributed, "device_index", spy)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    for local_rank in range(4):
        assert distributed._pick_device(local_rank) == torch.device("cuda", device_index(local_rank, 2))
    assert calls == [(r, 2) for r in range(4)] and chosen == [0, 1, 0, 1]


# --- GPUs ------------------------------------------------------------------------------------

def test_a_per_node_list_with_a_gpu_per_task_is_fine():
    probes = node_of(4, CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_GPUS_ON_NODE="4")
    assert [p["gpu"] for p in probes] == ["0", "1", "2", "3"]
    assert diagnose(probes) == []
    assert "GPU by rank: 0:0 1:1 2:2 3:3" in render(probes, [])


def test_a_per_node_list_shorter_than_the_tasks_shares_gpus():
    probes = node_of(4, CUDA_VISIBLE_DEVICES="0,1", SLURM_GPUS_ON_NODE="2")
    [problem] = diagnose(probes)
    assert "ranks 0,2 on GPU 0; ranks 1,3 on GPU 1" in problem and "n1" in problem
    assert "CUDA_VISIBLE_DEVICES=0,1" in problem and "--gpus-per-task=1" in problem and "GUIDE_GPU_REQUEST" in problem


def test_per_task_lists_are_fine_when_each_names_its_own_gpu():
    probes = node_of(2, lambda i: {"CUDA_VISIBLE_DEVICES": str(i)}, SLURM_JOB_GPUS="0,1")
    assert [p["gpu"] for p in probes] == ["0", "1"] and diagnose(probes) == []


def test_per_task_lists_that_all_name_gpu_0_share_it_on_one_node_only():
    same_node = node_of(2, CUDA_VISIBLE_DEVICES="0", SLURM_JOB_GPUS="0")
    [problem] = diagnose(same_node)
    assert "ranks 0,1 on GPU 0" in problem
    two_nodes = node_of(1, CUDA_VISIBLE_DEVICES="0", SLURM_JOB_GPUS="0", node="n1") + \
        node_of(1, CUDA_VISIBLE_DEVICES="0", SLURM_JOB_GPUS="0", node="n2", first=1)
    assert diagnose(two_nodes) == []


def test_an_amd_site_lists_gpus_in_rocr_visible_devices():
    fine = node_of(2, ROCR_VISIBLE_DEVICES="0,1", SLURM_GPUS_ON_NODE="2")
    assert [p["gpu"] for p in fine] == ["0", "1"] and diagnose(fine) == []
    [problem] = diagnose(node_of(2, ROCR_VISIBLE_DEVICES="0", SLURM_GPUS_ON_NODE="1"))
    assert "ROCR_VISIBLE_DEVICES=0" in problem and "ranks 0,1 on GPU 0" in problem


def test_a_task_of_a_gpu_job_without_a_gpu_is_a_problem():
    probes = node_of(2, CUDA_VISIBLE_DEVICES="", SLURM_JOB_GPUS="0,1")
    [problem] = diagnose(probes)
    assert "rank(s) 0,1 on n1 see no GPU (CUDA_VISIBLE_DEVICES is empty)" in problem
    assert "SLURM_JOB_GPUS=0,1" in problem and "--gpus-per-task=1" in problem
    assert "GPU by rank: 0:- 1:-" in render(probes, [problem])


def test_a_step_started_without_the_job_s_gpus_is_a_problem():
    """srun --gres=none in a GPU job: Slurm sets no device list, SLURM_JOB_GPUS comes from the job."""
    [problem] = diagnose(node_of(2, SLURM_JOB_GPUS="0,1"))
    assert "rank(s) 0,1 on n1 see no GPU (no device list, no SLURM_GPUS_ON_NODE)" in problem
    assert "--gres=none" in problem
    # A job-wide count alone: every task sees the node's GPUs, none is judged.
    counted = node_of(2, SLURM_GPUS_PER_NODE="2")
    assert diagnose(counted) == [] and "GPU by rank: 0:? 1:? (?: no device list" in render(counted, [])


def test_gpus_per_task_without_binding_give_each_rank_its_own_gpu():
    """--gpus-per-task=1 --gpu-bind=none (the Perlmutter-like profile), as Slurm 22.05 starts
    it on the test Slurm: no device list, no SLURM_STEP_GPUS, the step's count in
    SLURM_GPUS_ON_NODE and the job's list from the batch shell. Each task sees the node's GPUs
    and takes its own by local rank; one GPU for two ranks is still a problem."""
    unbound = {"SLURM_GPUS_ON_NODE": "2", "SLURM_GPUS_PER_TASK": "1", "SLURM_JOB_GPUS": "0,1"}
    probes = node_of(2, **unbound)
    assert [p["gpu"] for p in probes] == ["0", "1"] and diagnose(probes) == []
    assert "GPU by rank: 0:0 1:1" in render(probes, [])
    [problem] = diagnose(node_of(2, **{**unbound, "SLURM_GPUS_ON_NODE": "1"}))
    assert "ranks 0,1 on GPU 0" in problem
    # The same job's step started with --gres=none: no count, so no GPU.
    [problem] = diagnose(node_of(2, SLURM_GPUS_PER_TASK="1", SLURM_JOB_GPUS="0,1"))
    assert "see no GPU" in problem


def test_a_cpu_job_has_no_gpu_problems():
    probes = node_of(4)  # no device list, no GPU variable
    assert diagnose(probes) == [] and "GPU by rank: none" in render(probes, [])
    empty = node_of(2, CUDA_VISIBLE_DEVICES="")  # a site that hides GPUs from CPU jobs
    assert diagnose(empty) == []


# --- CPUs ------------------------------------------------------------------------------------

def test_tasks_bound_to_one_cpu_each_when_the_job_asked_for_two():
    probes = [task("n1", 0, 0, {0}), task("n1", 1, 1, {1})]
    [problem] = diagnose(probes)
    assert "on n1 (ranks 0,1) may use 1 CPU(s) each, the job asked for 2 per task" in problem
    assert "SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK" in problem and "22.05-23.02" in problem
    text = render(probes, [problem])
    assert text.splitlines()[0] == "n1  2 task(s), 1 CPU(s) each (asked 2); GPU by rank: none"
    assert text.endswith("tasks usable: NO (2 task(s) on 1 node(s))")


def test_cpus_per_task_is_the_node_s_cpus_over_its_tasks():
    assert diagnose([task("n1", 0, 0, {0, 1}), task("n1", 1, 1, {2, 3})]) == []
    assert diagnose([task("n1", 0, 0, range(4)), task("n1", 1, 1, range(4))]) == []  # shared, 2 each
    [problem] = diagnose([task("n1", 0, 0, range(3)), task("n1", 1, 1, range(3))])
    assert "1.5 CPU(s) each" in problem
    # One node short, the other fine: only the short one is named.
    [problem] = diagnose([task("n1", 0, 0, {0}), task("n2", 1, 0, {0, 1})])
    assert "on n1 (ranks 0)" in problem


def test_no_cpus_per_task_in_the_job_means_no_cpu_verdict():
    probes = [task("n1", 0, 0, {0}, cpus_per_task=None), task("n1", 1, 1, {1}, cpus_per_task=None)]
    assert diagnose(probes) == [] and "1 CPU(s) each;" in render(probes, [])


# --- launchers that start the processes themselves ------------------------------------------

def test_local_probes_in_the_batch_shell_split_the_node_s_cpus():
    shell = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
             "SLURMD_NODENAME": "n1", "SLURM_TASKS_PER_NODE": "2", "SLURM_CPUS_PER_TASK": "3",
             "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "0,1"}
    probes = local_probes(2, shell)
    assert [(p["rank"], p["local_rank"], p["gpu"], p["cpus_per_task"]) for p in probes] == \
        [(0, 0, "0", 3), (1, 1, "1", 3)]
    assert all(p["cpus"] == sorted(os.sched_getaffinity(0)) and p["local"] for p in probes)
    six = [dict(p, cpus=list(range(6))) for p in probes]
    assert diagnose(six) == []
    [problem] = diagnose([dict(p, cpus=[0, 1]) for p in probes])
    assert "the 2 processes a launcher starts on n1 would have 1 CPU(s) each" in problem
    assert "srun --cpus-per-task=6" in problem
    # More processes than the job has tasks here: they split the 2 x 3 CPUs of the node's tasks.
    assert {p["cpus_per_task"] for p in local_probes(4, shell)} == {1.5}


def test_local_probes_under_a_launcher_per_node_share_its_task_s_cpus():
    step = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_STEP_ID": "3", "SLURM_NODEID": "1",
            "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURMD_NODENAME": "n2", "SLURM_CPUS_PER_TASK": "8",
            "SLURM_TASKS_PER_NODE": "4(x2)"}
    probes = local_probes(4, step)
    assert [(p["rank"], p["local_rank"], p["cpus_per_task"]) for p in probes] == [(r, r - 4, 2) for r in range(4, 8)]
    with pytest.raises(tasks.GuideError, match="--local 0"):
        local_probes(0, step)


# --- the real probe and the commands ---------------------------------------------------------

def test_the_probe_of_this_process():
    mine = probe()
    assert mine["cpus"] == sorted(os.sched_getaffinity(0))
    assert mine["visible_gpus"] == visible_devices(os.environ)
    assert json.loads(json.dumps(mine)) == mine and tasks._invalid(mine) is None


def _run(*args, stdin=None, env=None, cpus=None):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM") and k not in ("RANK", "LOCAL_RANK")}
    return subprocess.run([sys.executable, *args], input=stdin, capture_output=True, text=True, timeout=120,
                          env={**clean, **(env or {})},
                          preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)


def test_tasks_bound_to_one_cpu_fail_the_doctor_end_to_end():
    """What Slurm 22.05's srun does to a -c 2 job, made real with sched_setaffinity."""
    mine = sorted(os.sched_getaffinity(0))
    cpus = [mine[r % len(mine)] for r in (0, 1)]  # a CPU each, as task/affinity binds them
    lines = [_run("-m", "guide_utils", "task-probe", cpus={cpus[r]},
                  env={"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r),
                       "SLURM_CPUS_PER_TASK": "2", "SLURMD_NODENAME": "n1"}).stdout for r in (0, 1)]
    assert [json.loads(line)["cpus"] for line in lines] == [[cpus[0]], [cpus[1]]]
    out = _run("-m", "guide_utils", "doctor", "--tasks", "-", stdin="".join(lines))
    assert out.returncode == 1, out.stdout + out.stderr
    each = len(set(cpus)) / 2
    assert f"PROBLEM: the 2 task(s) on n1 (ranks 0,1) may use {each:g} CPU(s) each, the job asked for 2" in out.stdout


def test_the_commands_pass_a_fine_job_and_read_a_file(tmp_path):
    probe_out = _run("-m", "guide_utils", "task-probe", "--local", "1")
    assert probe_out.returncode == 0 and len(probe_out.stdout.splitlines()) == 1
    path = tmp_path / "probes.jsonl"
    path.write_text(probe_out.stdout)
    out = _run("-m", "guide_utils", "doctor", "--tasks", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.rstrip().endswith("tasks usable: yes (1 task(s) on 1 node(s))") and "PROBLEM" not in out.stdout


@pytest.mark.parametrize("stdin, expected", [
    ('{"node": "n1"}\n', "line 1 of stdin is not a task probe (no 'rank')"),
    ("srun: error: n1: task 0: Exited\n", "line 1 of stdin is not a task probe (not a JSON object)"),
    ("\n", "stdin holds no task probes"),
])
def test_input_that_is_not_probes_is_one_line(stdin, expected):
    out = _run("-m", "guide_utils", "doctor", "--tasks", "-", stdin=stdin)
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
    assert expected in out.stderr and "Traceback" not in out.stderr and "task-probe" in out.stderr


def test_a_missing_file_and_a_bad_count_are_one_line(tmp_path):
    for args in (["doctor", "--tasks", str(tmp_path / "none.jsonl")], ["task-probe", "--local", "0"]):
        out = _run("-m", "guide_utils", *args)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr


def test_the_probe_imports_no_framework():
    """Every task of a job runs it before the training: no torch, TensorFlow or numpy."""
    out = _run("-X", "importtime", "-m", "guide_utils", "task-probe", env={"CUDA_VISIBLE_DEVICES": "0"})
    assert out.returncode == 0 and json.loads(out.stdout)["gpu"] == "0", out.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in out.stderr.splitlines()
                if line.startswith("import time:")}
    assert "guide_utils" in imported and not imported & {"torch", "tensorflow", "numpy"}


# --- a real Slurm job ------------------------------------------------------------------------

cluster = pytest.fixture(scope="module", name="cluster")(slurm_cluster.module_cluster)

STEPS = {  # probe file: srun options of its step, in a job of -N2 --ntasks-per-node=1 -c2 --gres=gpu:2
    "inherited": "--cpu-bind=cores",
    "exported": "--cpu-bind=cores",  # with SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
    "gres2": "-N1 -n2 -c1 --gres=gpu:2",
    "gres1": "-N1 -n2 -c1 --gres=gpu:1",
    "per_task": "-N1 -n2 -c1 --gpus-per-task=1",
    "per_task_unbound": "-N1 -n2 -c1 --gpus-per-task=1 --gpu-bind=none",
    "no_gpus": "-N1 -n2 -c1 --gres=none",
}


@pytest.mark.slurm
@pytest.mark.slow
def test_the_probes_of_a_real_slurm_job(cluster, tmp_path):
    """What srun really gives tasks (task/affinity binding, GRES device lists), judged."""
    probe = f"{sys.executable} -m guide_utils task-probe"
    lines = ["#!/bin/bash", f"cd {tmp_path}"]
    for name, opts in STEPS.items():
        export = "SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK " if name == "exported" else ""
        lines.append(f"{export}srun {opts} {probe} > {name}.jsonl")
    lines.append(f"{probe} --local 2 > shell.jsonl")
    script = tmp_path / "job.sh"
    script.write_text("\n".join(lines) + "\n")
    out = subprocess.run(["sbatch", "--parsable", "-N2", "--ntasks-per-node=1", "-c2", "--gres=gpu:2",
                          f"--output={tmp_path}/job.out", str(script)], env=cluster.env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    (record,) = cluster.wait(out.stdout.strip().split(";")[0], timeout=300)
    assert record["JobState"] == "COMPLETED", (tmp_path / "job.out").read_text()
    found = {f: diagnose(read_probes((tmp_path / f"{f}.jsonl").read_text(), f)) for f in [*STEPS, "shell"]}
    version = subprocess.run(["srun", "--version"], env=cluster.env, capture_output=True, text=True).stdout
    major_minor = tuple(int(n) for n in re.search(r"(\d+)\.(\d+)", version).groups())
    if (22, 5) <= major_minor <= (23, 2):  # srun forgets the job's -c: one CPU per task
        assert len(found["inherited"]) == 2 and all("1 CPU(s) each, the job asked for 2" in p
                                                     for p in found["inherited"]), found["inherited"]
    else:
        assert found["inherited"] == [], version
    assert found["gres1"] and "ranks 0,1 on GPU 0" in found["gres1"][0]
    assert found["no_gpus"] and "see no GPU" in found["no_gpus"][0]
    fine = {f: p for f, p in found.items() if f not in ("inherited", "gres1", "no_gpus")}
    assert fine == {f: [] for f in fine}, fine
    per_task = read_probes((tmp_path / "per_task.jsonl").read_text(), "per_task")
    assert sorted(p["visible_gpus"] for p in per_task) == [["0"], ["1"]]  # a list per task
    unbound = read_probes((tmp_path / "per_task_unbound.jsonl").read_text(), "per_task_unbound")
    assert sorted(p["gpu"] for p in unbound) == ["0", "1"] and {p["visible_gpus"] for p in unbound} == {None}


@pytest.mark.slurm
def test_a_slurmd_that_dies_is_restarted_and_its_node_stays_up(cluster):
    """The test Slurm's watchdog (tests/slurm_cluster.py): slurmd aborting, as Debian's 22.05
    did once in CI, is recorded and started again, and both nodes then run a step, instead of
    the node going DOWN with every job on it."""
    since = time.monotonic()
    (slurmd,) = [p for name, p in cluster.procs if name == "slurmd-guide-n2"]
    os.kill(slurmd.pid, signal.SIGABRT)
    end = time.monotonic() + 20
    while not cluster.crashes_since(since) and time.monotonic() < end:
        time.sleep(0.2)
    (crash,) = cluster.crashes_since(since)
    assert crash.name == "slurmd-guide-n2" and crash.status == -signal.SIGABRT and crash.restarted, crash
    cluster.crashes.remove(crash)  # made here: not one for the run's warnings (module_cluster)
    out = subprocess.run(["srun", "-N2", "-n2", "--ntasks-per-node=1", "sh", "-c", "echo $SLURMD_NODENAME"],
                         env=cluster.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and sorted(out.stdout.split()) == ["guide-n1", "guide-n2"], out.stderr
    states = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=cluster.env, capture_output=True, text=True)
    assert "down" not in states.stdout and "not_responding" not in states.stdout, states.stdout
