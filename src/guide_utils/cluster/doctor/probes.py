"""The doctor's probes: small programs that report a framework's versions and build, each
run in an interpreter of its own, and the MPI on the PATH. (The network NCCL uses between
nodes, ``doctor --network``, and the node's own network: ``network``.)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any, Mapping

# Each framework is probed in its own interpreter: a broken extension can crash the process
# that loads it, and the doctor must still report everything else. Horovod's probe runs after
# the framework it binds to, in the same interpreter (it imports that framework anyway, as a
# training does): one import fewer, and a crash in Horovod keeps the framework's facts, printed
# first. Where a job uses both frameworks, each binding is checked in its own framework's
# interpreter ("horovod" after PyTorch, "horovod_tf" after TensorFlow, merged by
# ``merge_horovod``): TensorFlow is imported once, not a second time beside PyTorch.
# Each probe leaves its facts in ``result``.
PROBES = {
    "torch": """
import torch, torchvision
gpus, arch = [], []
try:  # the GPU architectures this build has kernels for (empty on CPU-only builds)
    arch = torch.cuda.get_arch_list()
except Exception:
    pass
driver = None
try:  # NVIDIA: the newest CUDA the driver supports, e.g. 12040 for 12.4 (NVML, nvidia-ml-py)
    if torch.version.cuda:
        import pynvml
        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetCudaDriverVersion()
except Exception:
    pass
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        gpus.append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                     "capability": "sm_%d%d" % torch.cuda.get_device_capability(i),
                     "gfx": getattr(p, "gcnArchName", None) if torch.version.hip else None})
result = {"torch": torch.__version__, "torchvision": torchvision.__version__,
          "torch_cuda": torch.version.cuda, "torch_hip": torch.version.hip, "arch_list": arch,
          "cuda_driver": driver, "gpus": gpus}
""",
    "tensorflow": """
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf, keras
build = ("CUDA %s" % tf.sysconfig.get_build_info().get("cuda_version", "?") if tf.test.is_built_with_cuda()
         else "ROCm" if tf.test.is_built_with_rocm() else "CPU-only")  # tensorflow-cpu: CPU-only
result = {"tensorflow": tf.__version__, "keras": keras.__version__, "build": build,
          "gpus": len(tf.config.list_physical_devices("GPU"))}
""",
    # Horovod's build flags, and which frameworks' bindings load (FRAMEWORKS is filled in).
    "horovod": """
import importlib, os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import horovod
frameworks, hvd = {}, None
for name, module in FRAMEWORKS:
    try:
        binding = importlib.import_module(module)
    except Exception:
        frameworks[name] = False
        continue
    # A binding whose compiled extension was never built still imports: Horovod prints a
    # warning and leaves its operations out (so horovodrun --check-build still ticks it).
    frameworks[name] = hasattr(binding, "allreduce")
    hvd = binding if frameworks[name] else hvd
result = {
    "horovod": horovod.__version__, "frameworks": frameworks,
    "controllers": {"MPI": bool(hvd.mpi_built()), "Gloo": bool(hvd.gloo_built())} if hvd else None,
    "operations": {"NCCL": bool(hvd.nccl_built()), "DDL": bool(hvd.ddl_built()),
                   "CCL": bool(hvd.ccl_built()), "MPI": bool(hvd.mpi_built()),
                   "Gloo": bool(hvd.gloo_built())} if hvd else None,
}
""",
}
HOROVOD_BINDINGS = {"pytorch": ("PyTorch", "horovod.torch"), "tensorflow": ("TensorFlow", "horovod.tensorflow")}


# A probe is given up when it is stuck, not when it is slow. Importing a framework takes
# seconds on an idle node but minutes where a shared file system is cold or many jobs share
# the CPUs (the tests' Slurm puts 8 jobs on each CPU): a wall-clock limit would call a working
# stack broken there. Stuck is: no CPU time gained for STALL_S (blocked in a GPU driver or on
# a file system that does not answer), more CPU time than any import needs (spinning), or
# WALL_LIMIT_S in all.
STALL_S = 120.0
CPU_LIMIT_S = 300.0
WALL_LIMIT_S = 1800.0


def _cpu_seconds(pid: int) -> float | None:
    """CPU time of process ``pid`` so far (Linux's /proc, else psutil); None if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, IndexError, ValueError):
        pass
    try:
        import psutil

        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except Exception:  # no psutil, or the process is gone
        return None


def _watch(proc: subprocess.Popen, state: dict, now: float, *, stall_s: float,
           cpu_limit_s: float, wall_limit_s: float) -> str | None:
    """Why ``proc`` should be given up now, to follow "importing NAME", or None; ``state``
    keeps its last progress."""
    cpu = _cpu_seconds(proc.pid)
    if cpu is None:  # cannot tell stuck from slow here: only the wall limit applies
        state["progress"] = now
    elif cpu > state["cpu"]:
        state["cpu"], state["progress"] = cpu, now
    if state["cpu"] > cpu_limit_s:
        return f"used over {cpu_limit_s:.0f} s of CPU time (spinning?)"
    if now - state["progress"] > stall_s:
        return f"made no progress for {stall_s:.0f} s (stuck in a GPU driver or a file system?)"
    if now - state["start"] > wall_limit_s:
        return f"took over {wall_limit_s:.0f} s"
    return None


MARK = "guide-probe: "
STAGE = """try:
{code}
    _out = {{"result": result}}
except Exception as _e:
    _out = {{"error": f"{{type(_e).__name__}}: {{_e}}"}}
print({mark!r} + __import__("json").dumps(_out), flush=True)
"""


# Horovod's probes and the framework interpreters they run after, in order of preference.
HOROVOD_HOSTS = {"horovod": ("torch", "tensorflow"), "horovod_tf": ("tensorflow",)}


def _groups(names: list[str]) -> list[list[str]]:
    """The probes by interpreter: Horovod's after PyTorch's, else after TensorFlow's;
    ``horovod_tf`` after TensorFlow's."""
    groups = [[n] for n in names if n not in HOROVOD_HOSTS]
    for probe, hosts in HOROVOD_HOSTS.items():
        if probe in names:
            host = next((g for first in hosts for g in groups if g[0] == first), None)
            if host is None:
                groups.append([probe])
            else:
                host.append(probe)
    return groups


def merge_horovod(results: dict[str, tuple[dict[str, Any] | None, str | None]]) -> None:
    """Fold ``horovod_tf`` (the TensorFlow binding, checked in TensorFlow's interpreter) into
    ``horovod`` (the PyTorch binding), in place: one Horovod with both bindings. A binding
    whose interpreter stopped before its check is reported as not usable."""
    if "horovod_tf" not in results:
        return
    (main, main_error), (tf, tf_error) = results["horovod"], results.pop("horovod_tf")
    if main is None and tf is None:
        results["horovod"] = (None, main_error or tf_error)
        return
    both = [r for r in (main, tf) if r is not None]
    frameworks = {name: False for name, _ in HOROVOD_BINDINGS.values()}
    for r in both:
        frameworks.update(r["frameworks"])
    merged = {**both[0], "frameworks": frameworks}
    for key in ("controllers", "operations"):  # the build's flags: any working binding tells them
        merged[key] = next((r[key] for r in both if r.get(key)), None)
    results["horovod"] = (merged, None)


def _program(names: list[str], probes: Mapping[str, str]) -> str:
    return "".join(STAGE.format(code=textwrap.indent(probes[n].strip("\n"), "    "), mark=MARK) for n in names)


def _read(names: list[str], out: str, err: str, returncode: int | None, given_up: str | None,
          ) -> dict[str, tuple[dict[str, Any] | None, str | None]]:
    """Each probe's facts or error from its interpreter's output: the stages that printed
    theirs, then for the rest why the interpreter stopped (the last line of its errors)."""
    done = [json.loads(line[len(MARK):]) for line in out.splitlines() if line.startswith(MARK)]
    lines = [line for line in err.strip().splitlines() if line.strip()]
    stopped = (f"importing {names[len(done)]} {given_up}" if given_up and len(done) < len(names)
               else lines[-1] if lines else f"exit status {returncode}")
    results: dict[str, tuple[dict[str, Any] | None, str | None]] = {}
    for i, name in enumerate(names):
        if i < len(done):
            results[name] = (done[i].get("result"), done[i].get("error"))
        else:
            results[name] = (None, stopped)
    return results


def run_probes(probes: Mapping[str, str], *, stall_s: float = STALL_S, cpu_limit_s: float = CPU_LIMIT_S,
               wall_limit_s: float = WALL_LIMIT_S, poll_s: float = 1.0,
               ) -> dict[str, tuple[dict[str, Any] | None, str | None]]:
    """Run the probes, each group in its own interpreter, concurrently; ``name -> (result, error)``."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    groups = {"+".join(g): g for g in _groups(list(probes))}
    with contextlib.ExitStack() as stack:
        # Output to files, not pipes: a probe never blocks on a full pipe while another is watched.
        files = {key: (stack.enter_context(tempfile.TemporaryFile("w+")),
                       stack.enter_context(tempfile.TemporaryFile("w+"))) for key in groups}
        procs = {key: subprocess.Popen([sys.executable, "-c", _program(names, probes)], stdout=files[key][0],
                                       stderr=files[key][1], text=True, env=env)
                 for key, names in groups.items()}
        try:
            given_up = _wait(procs, stall_s=stall_s, cpu_limit_s=cpu_limit_s, wall_limit_s=wall_limit_s,
                             poll_s=poll_s)
        finally:  # Ctrl-C or an error here: no probe is left running
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
        results: dict[str, tuple[dict[str, Any] | None, str | None]] = {}
        for key, proc in procs.items():
            out_f, err_f = files[key]
            out_f.seek(0)
            err_f.seek(0)
            results.update(_read(groups[key], out_f.read(), err_f.read(), proc.returncode, given_up.get(key)))
    return {name: results[name] for name in probes}


def _wait(procs: Mapping[str, subprocess.Popen], *, stall_s: float, cpu_limit_s: float, wall_limit_s: float,
          poll_s: float) -> dict[str, str]:
    """Wait for every process; kill the stuck ones. Why each killed one was given up."""
    start = time.monotonic()
    watch = {key: {"cpu": 0.0, "progress": start, "start": start} for key in procs}
    given_up: dict[str, str] = {}
    running = dict(procs)
    while running:
        try:  # back as soon as one ends, or after poll_s to look at them all
            next(iter(running.values())).wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        for key, proc in list(running.items()):
            if proc.poll() is not None:
                del running[key]
                continue
            why = _watch(proc, watch[key], now, stall_s=stall_s, cpu_limit_s=cpu_limit_s,
                         wall_limit_s=wall_limit_s)
            if why:
                proc.kill()
                try:  # a process blocked in the kernel dies when it leaves the call: do not wait on it
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
                given_up[key] = why
                del running[key]
    return given_up


def mpi_version() -> str | None:
    """The first line of `mpirun --version`, with its path; None without an mpirun."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        return None
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return f"{mpirun} (did not answer --version)"
    first = (out.stdout or out.stderr).strip().splitlines()
    return f"{first[0].strip()} ({mpirun})" if first else mpirun
