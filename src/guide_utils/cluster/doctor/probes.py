"""The doctor's probes: small programs that report a framework's versions and build, each
run in an interpreter of its own, the MPI on the PATH, and the network NCCL (RCCL) uses
between nodes (``doctor --network``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
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
result = {"tensorflow": tf.__version__, "keras": keras.__version__,
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


# --- the network NCCL (RCCL) uses between nodes ------------------------------------------------
# One process creates a one-rank NCCL communicator and runs an allreduce with NCCL_DEBUG=INFO:
# NCCL then says which network plugin it loaded, or that it found none, and which network it
# uses ("Using network Socket" is TCP). On a Slingshot site that means the libfabric (OFI)
# plugin did not load and gradients cross the nodes over TCP, which nothing else reports.
NCCL_PROBE = """
import sys, torch
if not torch.cuda.is_available():
    print("GUIDE_NO_GPU"); sys.exit(0)
import torch.distributed as dist
dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
t = torch.ones(1, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
dist.destroy_process_group()
"""
_NCCL_LINES = {  # what NCCL 2.18-2.23 and RCCL print at NCCL_DEBUG=INFO, with the OFI plugin's own lines
    "library": re.compile(r"\b(NCCL|RCCL) version\s*:?\s*(\d+\.\d+\.\d+)"),
    "plugin": re.compile(r"NET/Plugin ?: Loaded net plugin (.+?) \(v\d+\)"),
    "ofi": re.compile(r"NET/OFI (?:Initializing|Using) (aws-ofi-[nr]ccl)\s*(\S*)"),
    "no_plugin": re.compile(r"NET/Plugin ?: .*(?:No plugin found|Could not find|Plugin load returned)|"
                            r"Using internal (?:network plugin|implementation)"),
    "network": re.compile(r"NCCL INFO Using network (.+?)\s*$"),
}
SOCKETS = "Socket"


def nccl_network(log: str) -> dict[str, Any]:
    """What an NCCL_DEBUG=INFO log says about the network: the library and its version, the
    network plugin loaded (None: none; its OFI version where it says), whether NCCL looked for
    a plugin and found none, and the network NCCL uses (None when it never said)."""
    found: dict[str, Any] = {"library": None, "version": None, "plugin": None, "ofi": None, "no_plugin": False,
                             "network": None}
    for line in log.splitlines():
        if m := _NCCL_LINES["library"].search(line):
            found["library"], found["version"] = m.group(1), m.group(2)
        elif m := _NCCL_LINES["plugin"].search(line):
            found["plugin"] = m.group(1)
        elif m := _NCCL_LINES["ofi"].search(line):
            found["ofi"] = " ".join(filter(None, m.groups()))
        elif _NCCL_LINES["no_plugin"].search(line):
            found["no_plugin"] = True
        elif m := _NCCL_LINES["network"].search(line):
            found["network"] = m.group(1)
    return found


def expects_plugin(env: Mapping[str, str]) -> bool:
    """Whether the site's settings say that NCCL should use a network plugin: NCCL_NET or
    NCCL_NET_PLUGIN named, libfabric's Slingshot (CXI) provider tuned, or the Slingshot
    interfaces (hsn*) given to NCCL."""
    return bool(env.get("NCCL_NET") or env.get("NCCL_NET_PLUGIN") or any(k.startswith("FI_CXI_") for k in env)
                or env.get("NCCL_SOCKET_IFNAME", "").lstrip("=^").startswith("hsn"))


def network_problems(found: dict[str, Any], env: Mapping[str, str]) -> list[str]:
    """PROBLEM lines: TCP sockets (or no network line at all) where the site expects a plugin."""
    if not expects_plugin(env):
        return []
    library = found["library"] or "NCCL"
    if found["network"] == SOCKETS:
        why = "it found no network plugin" if found["no_plugin"] else "the plugin it loaded was not used"
        return [f"{library} uses TCP sockets between nodes ({why}; NCCL_NET={env.get('NCCL_NET', '')!r}), although "
                f"this site's settings expect the libfabric (OFI) plugin: put the site's aws-ofi plugin "
                f"(libnccl-net.so, RCCL: librccl-net.so) on LD_LIBRARY_PATH or load its module, and set "
                f'NCCL_NET="AWS Libfabric" so that NCCL stops instead of falling back']
    if found["network"] is None:
        return [f"{library} did not say which network it uses (no 'Using network' line at NCCL_DEBUG=INFO): "
                f"check the probe's output above"]
    return []


def network_report(env: Mapping[str, str] = os.environ, timeout: float = 180) -> tuple[str, list[str]]:
    """Run the NCCL probe on this node's first GPU; (report line, PROBLEM lines). On a node
    without a GPU (or a PyTorch without CUDA/ROCm) there is nothing to check: a line says so."""
    run_env = {**env, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "PYTHONWARNINGS": "ignore"}
    try:
        out = subprocess.run([sys.executable, "-c", NCCL_PROBE], capture_output=True, text=True, env=run_env,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return "network  NCCL probe did not finish", [f"creating one NCCL communicator took over {timeout:.0f} s"]
    if "GUIDE_NO_GPU" in out.stdout:
        return "network  not checked (no GPU here: NCCL needs one)", []
    return judge_network(out.returncode, out.stdout + out.stderr, env)


def judge_network(returncode: int, log: str, env: Mapping[str, str]) -> tuple[str, list[str]]:
    """The report line and PROBLEM lines of one probe run (its exit status and NCCL's log)."""
    found = nccl_network(log)
    if returncode != 0:
        lines = [line.strip() for line in log.splitlines() if line.strip()]
        error = next((line for line in lines if " WARN " in line or "Error" in line), lines[-1] if lines else "")
        return (f"network  {found['library'] or 'NCCL'} {found['version'] or '?'} did not start",
                [f"one NCCL communicator failed ({error[-160:] or f'exit {returncode}'}); with NCCL_NET="
                 f"{env.get('NCCL_NET', '')!r} NCCL stops when that plugin does not load: put the site's aws-ofi "
                 f"plugin on LD_LIBRARY_PATH or load its module (NCCL_DEBUG=INFO shows where NCCL looked)"])
    plugin = found["plugin"] or ("none" if found["no_plugin"] else "?")
    ofi = f" ({found['ofi']})" if found["ofi"] else ""
    return (f"network  {found['library'] or 'NCCL'} {found['version'] or '?'}: {found['network'] or '?'} "
            f"(net plugin: {plugin}{ofi})", network_problems(found, env))
