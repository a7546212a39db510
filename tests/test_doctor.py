"""The doctor: pure diagnosis rules, then the real command on this machine's stack."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import pytest

from guide_utils.cluster.doctor import Facts, Job, diagnose, render
from guide_utils.runtime.gpus import rocm_driver
from guide_utils.runtime.slurm import SlurmJob

HEALTHY_HOROVOD = {
    "horovod": "0.28.1",
    "frameworks": {"PyTorch": True, "TensorFlow": True},
    "controllers": {"MPI": True, "Gloo": True},
    "operations": {"NCCL": True, "DDL": False, "CCL": False, "MPI": True, "Gloo": True},
}
A100 = {"name": "NVIDIA A100-SXM4-40GB", "memory_gib": 39.4}


def healthy(**changes) -> Facts:
    facts = Facts(
        torch={"torch": "2.14.1", "torchvision": "0.29.1", "torch_cuda": "13.0", "gpus": [A100] * 4},
        tensorflow={"tensorflow": "2.15.1", "keras": "2.15.0"},
        horovod=horovod_facts(),
        mpi="mpirun (Open MPI) 4.1.4",
        omp_num_threads="7",
    )
    return dataclasses.replace(facts, **changes)


def horovod_facts(**ops):
    h = {k: (dict(v) if isinstance(v, dict) else v) for k, v in HEALTHY_HOROVOD.items()}
    h["operations"].update(ops)
    return h


def job(**env) -> SlurmJob:
    base = {"SLURM_JOB_ID": "99", "SLURM_JOB_NODELIST": "g[1-2]", "SLURM_TASKS_PER_NODE": "4(x2)",
            "SLURM_GPUS_PER_NODE": "4", "SLURM_CPUS_PER_TASK": "8"}
    return SlurmJob.from_env({**base, **env})


def test_healthy_stack_has_nothing_to_say():
    d = diagnose(healthy(slurm=job()))
    assert d.warnings == [] and d.problems == [] and d.usable


def test_gpus_without_nccl_warns():
    """The whole guide (no --dist): a warning, as most of it needs no Horovod."""
    d = diagnose(healthy(horovod=horovod_facts(NCCL=False)))
    assert len(d.warnings) == 1 and "without NCCL" in d.warnings[0] and "HOROVOD_GPU_OPERATIONS=NCCL" in d.warnings[0]
    assert d.usable


def test_a_horovod_job_on_gpus_without_nccl_is_a_problem():
    """DIST=horovod on GPUs with a Horovod without NCCL (the guide's own `make`-built one) would
    average every gradient through host memory: the job stops, naming the rebuild and DDP."""
    job = Job("pytorch", "horovod")
    d = diagnose(healthy(horovod=horovod_facts(NCCL=False), job=job))
    [problem] = d.problems
    assert "4 GPU(s) visible but Horovod was built without NCCL" in problem and "HOROVOD_GPU_OPERATIONS=NCCL" in problem
    assert "--dist ddp" in problem and "GUIDE_HOROVOD=no" in problem
    cpu_node = dict(healthy().torch, gpus=[])
    assert diagnose(healthy(torch=cpu_node, horovod=horovod_facts(NCCL=False), job=job)).usable  # CPUs: no NCCL needed
    tf_job = diagnose(healthy(horovod=horovod_facts(NCCL=False), job=Job("tensorflow", "horovod")))
    assert any("without NCCL" in p and "--dist mwms" in p for p in tf_job.problems), tf_job


def without_mpi() -> dict:
    h = horovod_facts(MPI=False)
    h["controllers"] = {"MPI": False, "Gloo": True}
    return h


def test_a_horovod_without_mpi_is_a_problem_where_srun_starts_the_ranks():
    """srun --mpi=pmix starts the ranks; only Horovod's MPI controller joins them (without it
    each rank makes a world of one). horovodrun --gloo in the batch shell needs no MPI."""
    d = diagnose(healthy(horovod=without_mpi(), job=Job("pytorch", "horovod", launch="tasks")))
    [problem] = d.problems
    assert problem.startswith("Horovod was built without MPI, but srun starts this job's ranks")
    assert "HOROVOD_WITH_MPI=1" in problem and "--dist ddp" in problem
    assert diagnose(healthy(horovod=without_mpi(), job=Job("pytorch", "horovod", launch="shell"))).usable
    assert diagnose(healthy(horovod=horovod_facts(), job=Job("pytorch", "horovod", launch="tasks"))).usable


# A Horovod as a build without MPI reports itself (Gloo only, no NCCL), with no compiled code:
# what the probe reads from it is what a real such build's bindings answer.
STAND_IN_HOROVOD = {
    "horovod/__init__.py": '__version__ = "0.28.1"\n',
    "horovod/torch/__init__.py": "def allreduce(tensor, **kwargs):\n    return tensor\n\n\n"
                                 "def mpi_built():\n    return False\n\n\ndef gloo_built():\n    return True\n\n\n"
                                 "def nccl_built():\n    return False\n\n\nddl_built = ccl_built = nccl_built\n",
}


def test_the_probe_reads_a_horovod_built_without_mpi(tmp_path, monkeypatch):
    from guide_utils.cluster.doctor.probes import run_probes

    for name, text in STAND_IN_HOROVOD.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    job = Job("pytorch", "horovod", launch="tasks")
    [(result, error)] = run_probes({"horovod": job.probes()["horovod"]}, poll_s=0.2).values()
    assert error is None and result["controllers"] == {"MPI": False, "Gloo": True}, (result, error)
    assert result["frameworks"] == {"PyTorch": True}
    problems = diagnose(healthy(horovod=result, job=job)).problems
    assert any(p.startswith("Horovod was built without MPI") for p in problems), problems


def test_tasks_per_node_must_match_gpus_per_node():
    d = diagnose(healthy(slurm=job(SLURM_TASKS_PER_NODE="8(x2)")))
    assert any("tasks per node (8) differ from GPUs per node (4)" in w for w in d.warnings), d.warnings


def test_loader_workers_above_cpus_per_task():
    d = diagnose(healthy(slurm=job(SLURM_CPUS_PER_TASK="2"), loader_workers=4))
    assert any("4 DataLoader workers per task but only 2 CPU(s)" in w for w in d.warnings), d.warnings


def test_unset_omp_threads_with_several_tasks_per_node():
    d = diagnose(healthy(slurm=job(), omp_num_threads=None))
    assert any("OMP_NUM_THREADS" in w for w in d.warnings)


def test_horovod_missing_is_a_problem():
    d = diagnose(healthy(horovod=None, errors={"horovod": "No module named 'horovod'"}))
    assert not d.usable and "No module named 'horovod'" in d.problems[0]


def test_horovod_without_controllers_is_a_problem():
    h = horovod_facts()
    h["controllers"] = {"MPI": False, "Gloo": False}
    assert not diagnose(healthy(horovod=h)).usable


def test_tensorflow_216_is_warned_about():
    d = diagnose(healthy(tensorflow={"tensorflow": "2.16.1", "keras": "3.3.3"}))
    assert any("Keras 3" in w for w in d.warnings)


V100 = {"name": "Tesla V100-SXM2-32GB", "memory_gib": 31.7, "capability": "sm_70"}
CU130_KERNELS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]  # torch 2.14.1+cu130's arch list


def test_gpus_in_the_allocation_that_pytorch_cannot_see_are_a_problem():
    cpu_build = {"torch": "2.14.1+cpu", "torchvision": "0.29.1", "torch_cuda": None, "gpus": []}
    d = diagnose(healthy(torch=cpu_build, gpu_env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}))
    assert [p for p in d.problems if "the job has GPUs (CUDA_VISIBLE_DEVICES=0,1,2,3)" in p and "CPU-only" in p]
    # the same PyTorch without GPUs in the job is fine (a CPU job)
    assert diagnose(healthy(torch=cpu_build, gpu_env={"CUDA_VISIBLE_DEVICES": ""})).usable


def test_an_amd_node_needs_a_rocm_build():
    cuda_build = {"torch": "2.14.1", "torchvision": "0.29.1", "torch_cuda": "13.0", "gpus": []}
    d = diagnose(healthy(torch=cuda_build, gpu_env={"ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}))
    assert any("ROCm build of PyTorch" in p and "CUDA 13.0 build" in p for p in d.problems), d.problems


def test_an_amd_node_is_known_by_its_driver_or_rocms_lists_not_by_the_first_variable(tmp_path):
    """Slurm's GRES sets CUDA_VISIBLE_DEVICES on AMD nodes too, and the doctor quotes the first
    variable that names a GPU: the fix comes from ROCm's own lists anywhere in the job's
    variables, or from the node's ROCm driver (/dev/kfd), which gather() reads."""
    cuda_build = {"torch": "2.14.1", "torchvision": "0.29.1", "torch_cuda": "13.0", "gpus": []}
    both = {"CUDA_VISIBLE_DEVICES": "0,1", "ROCR_VISIBLE_DEVICES": "0,1"}
    [problem] = diagnose(healthy(torch=cuda_build, gpu_env=both)).problems
    assert "(CUDA_VISIBLE_DEVICES=0,1)" in problem and "install a ROCm build of PyTorch" in problem
    counted = {"SLURM_GPUS_ON_NODE": "8"}  # no list at all: only the driver tells
    assert "install a PyTorch built for these GPUs" in diagnose(healthy(torch=cuda_build, gpu_env=counted)).problems[0]
    [problem] = diagnose(healthy(torch=cuda_build, gpu_env=counted, rocm_driver=True)).problems
    assert "install a ROCm build of PyTorch" in problem
    assert not rocm_driver(str(tmp_path))
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kfd").touch()
    assert rocm_driver(str(tmp_path))


def test_a_gpu_the_build_has_no_kernels_for_is_a_problem():
    """A V100 (sm_70) under a CUDA 13 wheel: the GPU is seen, its first kernel would fail."""
    torch = {"torch": "2.14.1", "torchvision": "0.29.1", "torch_cuda": "13.0", "arch_list": CU130_KERNELS,
             "gpus": [V100] * 4}
    d = diagnose(healthy(torch=torch, gpu_env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}))
    assert len([p for p in d.problems if "no kernel image" in p and "sm_70" in p]) == 4, d.problems
    a100 = dict(A100, capability="sm_80")
    assert diagnose(healthy(torch=dict(torch, gpus=[a100] * 4))).usable


# As a ROCm 6.2 build of PyTorch reports them on an MI250X node (get_arch_list(), gcnArchName).
ROCM62_TARGETS = ["gfx900", "gfx906", "gfx908", "gfx90a", "gfx1030", "gfx1100", "gfx942"]
MI250X_GCD = {"name": "AMD Instinct MI250X", "memory_gib": 64.0, "capability": "sm_90", "gfx": "gfx90a:sramecc+:xnack-"}


def test_an_amd_gpu_the_rocm_build_has_no_code_objects_for_is_a_problem():
    """gfx90a (MI250X) is among ROCm 6.2's targets; a build without it fails at its first
    kernel, which the doctor says before the job trains."""
    rocm = {"torch": "2.5.1+rocm6.2", "torchvision": "0.20.1", "torch_cuda": None, "torch_hip": "6.2.41133",
            "arch_list": ROCM62_TARGETS, "gpus": [MI250X_GCD] * 8}
    env = {"ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    assert diagnose(healthy(torch=rocm, gpu_env=env)).usable
    narrow = dict(rocm, arch_list=["gfx1030", "gfx1100"])  # a build for Radeon cards only
    problems = [p for p in diagnose(healthy(torch=narrow, gpu_env=env)).problems if "ROCm targets" in p]
    assert len(problems) == 8 and "gfx90a" in problems[0] and "no code object" in problems[0], problems


def test_a_driver_older_than_the_builds_cuda_is_a_problem():
    """cudaDriverGetVersion 11080 (a CUDA 11.8 driver) cannot start a CUDA 12 build; a 12.4
    driver runs a 12.6 build (minor version compatibility)."""
    torch = {"torch": "2.5.1", "torchvision": "0.20.1", "torch_cuda": "12.4", "arch_list": ["sm_80", "sm_90"],
             "gpus": [dict(A100, capability="sm_80")], "cuda_driver": 11080}
    [problem] = [p for p in diagnose(healthy(torch=torch)).problems if "driver" in p]
    assert "supports CUDA up to 11.8" in problem and "built for CUDA 12.4" in problem
    assert diagnose(healthy(torch=dict(torch, cuda_driver=12040, torch_cuda="12.6"))).usable


CPU_TF = {"tensorflow": "2.15.1", "keras": "2.15.0", "build": "CPU-only", "gpus": 0}  # the lock's tensorflow-cpu


def test_gpus_in_the_allocation_that_tensorflow_cannot_see_are_a_problem():
    """The lock's tensorflow-cpu on a GPU job: it would train on the CPU (MWMS: over RING)."""
    nvidia = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    for dist in ("mwms", "horovod", "none"):
        d = diagnose(healthy(tensorflow=CPU_TF, gpu_env=nvidia, job=Job("tensorflow", dist)))
        [problem] = [p for p in d.problems if "sees none" in p]
        assert problem.startswith("the job has GPUs (CUDA_VISIBLE_DEVICES=0,1,2,3) but this TensorFlow 2.15.1 "
                                  "(CPU-only build) sees none, so it would train on the CPU"), problem
        assert "tensorflow==2.15.1 (the GPU wheel" in problem
    amd = diagnose(healthy(tensorflow=CPU_TF, gpu_env={"SLURM_GPUS_ON_NODE": "8", "ROCR_VISIBLE_DEVICES": "0"},
                           job=Job("tensorflow", "mwms")))
    assert any("ROCR_VISIBLE_DEVICES=0" in p and "ROCm build of TensorFlow" in p for p in amd.problems), amd
    # a CPU job, or a TensorFlow that sees the GPUs: nothing to say
    assert diagnose(healthy(tensorflow=CPU_TF, job=Job("tensorflow", "mwms"))).usable
    gpu_tf = dict(CPU_TF, build="CUDA 12.2", gpus=4)
    assert diagnose(healthy(tensorflow=gpu_tf, gpu_env=nvidia, job=Job("tensorflow", "mwms"))).usable
    # the whole guide: TensorFlow is optional (chapter 8 only), so a warning
    whole = diagnose(healthy(tensorflow=CPU_TF, gpu_env=nvidia))
    assert whole.usable and any("this TensorFlow 2.15.1 (CPU-only build) sees none" in w for w in whole.warnings)


def test_tensorflow_216_is_a_problem_only_where_horovod_is_used():
    tf216 = {"tensorflow": "2.16.1", "keras": "3.3.3"}
    mwms = diagnose(healthy(tensorflow=tf216, job=Job(framework="tensorflow", dist="mwms")))
    assert mwms.usable and any("not the 2.15" in w for w in mwms.warnings), mwms
    horovod = diagnose(healthy(tensorflow=tf216, job=Job(framework="tensorflow", dist="horovod")))
    assert any("Keras 3" in p for p in horovod.problems), horovod


@pytest.mark.slow
def test_the_doctor_in_a_gpu_step_whose_pytorch_sees_no_gpu():
    """A step that was given two GPUs this PyTorch cannot use: what a wrong wheel on a GPU
    node looks like. The two GPUs are named by UUIDs no device has, so that PyTorch sees none
    on any machine, with or without GPUs (CUDA stops at the first unknown entry)."""
    gpus = "GPU-00000000-0000-0000-0000-000000000000,GPU-00000000-0000-0000-0000-000000000001"
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "gpu01", "SLURM_TASKS_PER_NODE": "1",
           "SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": gpus}
    out = _doctor(env, ["--framework", "pytorch", "--dist", "ddp"])
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"PROBLEM: the job has GPUs (CUDA_VISIBLE_DEVICES={gpus}) but this PyTorch" in out.stdout, out.stdout


def test_render_lists_the_job():
    facts = healthy(slurm=job())
    text = render(facts, diagnose(facts))
    assert "g1,g2" in text and "20099" in text and text.endswith("stack usable: yes (for the whole guide)")


# --- the real command, on this machine's stack -------------------------------------------

def _doctor(env_extra=None, args=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "guide_utils", "doctor", *args], capture_output=True,
                          text=True, env=env, timeout=600)


@pytest.mark.slow
def test_doctor_on_this_machine():
    out = _doctor()
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    for expected in (r"torchvision +0\.29\.1", r"tensorflow +2\.15\.1 \(Keras 2\.15", r"horovod +0\.28\.1",
                     r"frameworks +\[X\] PyTorch  \[X\] TensorFlow", r"controllers +\[X\] MPI  \[X\] Gloo",
                     r"mpi +mpirun \(Open MPI\)", r"gpus +none", r"slurm job +none", r"stack usable: yes \(for the whole guide\)$"):
        assert re.search(expected, text, re.M), f"{expected!r} missing from:\n{text}"
    assert "WARNING" not in text


@pytest.mark.slow
def test_doctor_inside_a_misconfigured_slurm_job():
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[07-09]", "SLURM_NTASKS": "12",
           "SLURM_TASKS_PER_NODE": "4(x3)", "SLURM_GPUS_PER_NODE": "2", "SLURM_CPUS_PER_TASK": "2",
           "CUDA_VISIBLE_DEVICES": ""}  # PyTorch sees no GPU, on a GPU machine too
    out = _doctor(env, ["--dist", "none", "--loader-workers", "6"])
    # The job was given GPUs that this machine's PyTorch cannot see: that alone stops it.
    assert out.returncode == 1, out.stderr
    problems = [line for line in out.stdout.splitlines() if line.startswith("PROBLEM")]
    assert len(problems) == 1 and "the job has GPUs (SLURM_GPUS_PER_NODE=2)" in problems[0], out.stdout
    assert "3: gpu07,gpu08,gpu09" in out.stdout
    assert "gpu07:24242" in out.stdout
    assert "WARNING: tasks per node (4) differ from GPUs per node (2)" in out.stdout
    assert "WARNING: 6 DataLoader workers per task but only 2 CPU(s)" in out.stdout


@pytest.mark.slow
def test_doctor_fails_when_horovod_is_broken(tmp_path):
    # A Horovod that cannot import (what a half-finished build leaves behind).
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text("raise ImportError('libhorovod.so: undefined symbol')\n")
    broken = {"PYTHONPATH": str(tmp_path)}
    out = _doctor(broken)  # the whole guide needs Horovod
    assert out.returncode == 1
    assert "PROBLEM: Horovod does not import (ImportError: libhorovod.so: undefined symbol)" in out.stdout
    assert "stack usable: NO" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr
    # A horovod job fails with one line that names the fix ...
    out = _doctor(broken, ["--dist", "horovod"])
    problems = [line for line in out.stdout.splitlines() if line.startswith("PROBLEM")]
    assert out.returncode == 1 and len(problems) == 1, out.stdout
    assert "scripts/setup.sh" in problems[0] and "--dist ddp" in problems[0]
    # The jobs that need no Horovod pass with this broken one: the DDP and MultiWorkerMirrored
    # jobs of tests/test_slurm_examples.py run the full doctor with it, in a real job.


def test_the_quick_doctor_checks_the_job_not_the_frameworks(tmp_path):
    """GUIDE_DOCTOR=quick (the CI profile) runs `doctor --quick`: no framework is imported,
    so not even a broken Horovod stops it, and the report says what was not checked."""
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text("raise ImportError('libhorovod.so: undefined symbol')\n")
    env = {"PYTHONPATH": str(tmp_path), "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "g[1-2]", "SLURM_NTASKS": "4",
           "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_GPUS_PER_NODE": "4", "SLURM_CPUS_PER_TASK": "8"}
    out = _doctor(env, ["--quick", "--framework", "pytorch", "--dist", "horovod", "--launch", "tasks"])
    assert out.returncode == 0, out.stdout + out.stderr
    for part in ("torch", "tensorflow", "horovod", "gpus"):
        assert re.search(rf"^{part} +not checked \(--quick\)$", out.stdout, re.M), out.stdout
    assert "WARNING: tasks per node (2) differ from GPUs per node (4)" in out.stdout  # the job is still checked
    assert out.stdout.rstrip().endswith("stack usable: not checked (--quick) (for --framework pytorch --dist horovod)")


def test_a_job_needs_only_its_own_parts():
    no_horovod = healthy(horovod=None, errors={"horovod": "No module named 'horovod'"})
    assert diagnose(dataclasses.replace(no_horovod, job=Job("pytorch", "ddp"))).usable
    d = diagnose(dataclasses.replace(no_horovod, job=Job("pytorch", "horovod")))
    assert not d.usable and "--dist ddp" in d.problems[0]
    no_tf = healthy(tensorflow=None, errors={"tensorflow": "No module named 'tensorflow'"})
    assert diagnose(no_tf).usable  # the whole guide: TensorFlow is optional (a warning)
    assert not diagnose(dataclasses.replace(no_tf, job=Job("tensorflow", "mwms"))).usable
    assert set(Job("pytorch", "ddp").probes()) == {"torch"}
    assert set(Job("tensorflow", "horovod").probes()) == {"tensorflow", "horovod"}
    assert set(Job().probes()) == {"torch", "tensorflow", "horovod", "horovod_tf"}  # a binding each


def test_horovods_two_bindings_are_checked_in_their_own_frameworks_interpreters_and_merged():
    """The whole guide: Horovod's PyTorch binding after PyTorch, its TensorFlow binding after
    TensorFlow (TensorFlow imported once), reported as one Horovod."""
    from guide_utils.cluster.doctor.probes import merge_horovod, run_probes

    pid = "import os; result = os.getpid()"
    pids = run_probes({"torch": pid, "tensorflow": pid, "horovod": pid, "horovod_tf": pid}, poll_s=0.2)
    assert pids["torch"] == pids["horovod"] != pids["tensorflow"] == pids["horovod_tf"]
    flags = {"MPI": True, "Gloo": True}
    torch_side = {"horovod": "0.28.1", "frameworks": {"PyTorch": True}, "controllers": flags, "operations": flags}
    tf_side = {"horovod": "0.28.1", "frameworks": {"TensorFlow": True}, "controllers": flags, "operations": flags}
    both = {"horovod": (torch_side, None), "horovod_tf": (tf_side, None)}
    merge_horovod(both)
    assert both == {"horovod": ({**torch_side, "frameworks": {"PyTorch": True, "TensorFlow": True}}, None)}
    # TensorFlow's interpreter crashed before its binding was checked: that binding is not usable
    crashed = {"horovod": (torch_side, None), "horovod_tf": (None, "exit status -11")}
    merge_horovod(crashed)
    assert crashed["horovod"] == ({**torch_side, "frameworks": {"PyTorch": True, "TensorFlow": False}}, None)
    broken = {"horovod": (None, "ImportError: libhorovod.so"), "horovod_tf": (None, "ImportError: libhorovod.so")}
    merge_horovod(broken)
    assert broken == {"horovod": (None, "ImportError: libhorovod.so")}
    one = {"horovod": (torch_side, None)}  # a job of one framework: nothing to merge
    merge_horovod(one)
    assert one == {"horovod": (torch_side, None)}


def test_a_dist_of_the_other_framework_is_one_line():
    out = _doctor(args=["--framework", "tensorflow", "--dist", "ddp"])
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--dist ddp does not go with --framework tensorflow" in out.stderr


def test_doctor_rejects_a_wrong_flag():
    out = _doctor(args=["--loader-workers", "many"])
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "invalid int value: 'many'" in out.stderr


# --- the probes are given up when stuck, not when slow -------------------------------------
SLOW_BUT_WORKING = """
import time
end = time.monotonic() + 6
while time.monotonic() < end:  # short bursts of work between pauses: a starved import
    t = time.process_time() + 0.05
    while time.process_time() < t:
        pass
    time.sleep(0.5)
result = {"done": True}
"""


def test_a_probe_that_is_slow_but_working_is_waited_for():
    from guide_utils.cluster.doctor.probes import run_probes

    # every pause (0.5 s) is much shorter than the stall limit, the whole run (6 s) longer
    assert run_probes({"slow": SLOW_BUT_WORKING}, stall_s=4, wall_limit_s=120, poll_s=0.2) == {
        "slow": ({"done": True}, None)}


def test_a_stuck_probe_a_spinning_one_and_a_crashed_one_are_each_named():
    from guide_utils.cluster.doctor.probes import run_probes

    probes = {"stuck": "import time; time.sleep(600)",
              "spinning": "while True: pass",
              "crashed": "import sys; sys.exit('ImportError: libcudart.so.13: cannot open shared object file')",
              "fine": "result = {'ok': 1}"}
    # a stall limit that a runnable process does not reach even on a machine with a load of 30
    results = run_probes(probes, stall_s=10, cpu_limit_s=2, wall_limit_s=300, poll_s=0.2)
    assert results == {
        "stuck": (None, "importing stuck made no progress for 10 s (stuck in a GPU driver or a file system?)"),
        "spinning": (None, "importing spinning used over 2 s of CPU time (spinning?)"),
        "crashed": (None, "ImportError: libcudart.so.13: cannot open shared object file"),
        "fine": ({"ok": 1}, None)}


def test_a_probe_over_the_wall_limit_is_given_up():
    from guide_utils.cluster.doctor.probes import run_probes

    assert run_probes({"long": SLOW_BUT_WORKING}, stall_s=60, wall_limit_s=1, poll_s=0.2) == {
        "long": (None, "importing long took over 1 s")}


def test_horovod_is_probed_after_its_framework_and_a_crash_there_keeps_the_framework():
    from guide_utils.cluster.doctor.probes import run_probes

    pids = run_probes({"torch": "import os; result = os.getpid()", "tensorflow": "import os; result = os.getpid()",
                       "horovod": "import os; result = os.getpid()"}, poll_s=0.2)
    assert pids["torch"] == pids["horovod"] != pids["tensorflow"]  # Horovod's in PyTorch's interpreter
    # torch's facts are printed before Horovod's stage aborts the process
    crashed = run_probes({"torch": "import os; result = {'pid': os.getpid()}", "horovod": "import os; os.abort()",
                          "tensorflow": "import os, no_such_module_xyz"}, poll_s=0.2)
    assert crashed["torch"][1] is None and crashed["horovod"] == (None, "exit status -6")
    assert crashed["tensorflow"] == (None, "ModuleNotFoundError: No module named 'no_such_module_xyz'")
    # a stuck stage is named, the one before it kept
    stuck = run_probes({"tensorflow": "result = 1", "horovod": "import time; time.sleep(600)"}, stall_s=10,
                       poll_s=0.2)
    assert stuck == {"tensorflow": (1, None), "horovod": (
        None, "importing horovod made no progress for 10 s (stuck in a GPU driver or a file system?)")}
