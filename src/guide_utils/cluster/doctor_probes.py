"""The doctor's probes: small programs that report a framework's versions and build, each
run in an interpreter of its own, and the MPI on the PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any, Mapping

# Each framework is probed in its own interpreter: a broken extension can crash the process
# that loads it, and the doctor must still report everything else.
PROBES = {
    "torch": """
import json, torch, torchvision
gpus, arch = [], []
try:  # the GPU architectures this build has kernels for (empty on CPU-only builds)
    arch = torch.cuda.get_arch_list()
except Exception:
    pass
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        gpus.append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                     "capability": "sm_%d%d" % torch.cuda.get_device_capability(i)})
print(json.dumps({"torch": torch.__version__, "torchvision": torchvision.__version__,
                  "torch_cuda": torch.version.cuda, "torch_hip": torch.version.hip, "arch_list": arch,
                  "gpus": gpus}))
""",
    "tensorflow": """
import json, os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf, keras
print(json.dumps({"tensorflow": tf.__version__, "keras": keras.__version__,
                  "gpus": len(tf.config.list_physical_devices("GPU"))}))
""",
    # Horovod's build flags, and which frameworks' bindings load (FRAMEWORKS is filled in).
    "horovod": """
import importlib, json, os
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
print(json.dumps({
    "horovod": horovod.__version__, "frameworks": frameworks,
    "controllers": {"MPI": bool(hvd.mpi_built()), "Gloo": bool(hvd.gloo_built())} if hvd else None,
    "operations": {"NCCL": bool(hvd.nccl_built()), "DDL": bool(hvd.ddl_built()),
                   "CCL": bool(hvd.ccl_built()), "MPI": bool(hvd.mpi_built()),
                   "Gloo": bool(hvd.gloo_built())} if hvd else None,
}))
""",
}
HOROVOD_BINDINGS = {"pytorch": ("PyTorch", "horovod.torch"), "tensorflow": ("TensorFlow", "horovod.tensorflow")}


def run_probes(probes: Mapping[str, str], timeout: float = 300) -> dict[str, tuple[dict[str, Any] | None, str | None]]:
    """Run each probe in its own interpreter, concurrently; ``name -> (result, error)``."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    procs = {name: subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env)
             for name, code in probes.items()}
    results: dict[str, tuple[dict[str, Any] | None, str | None]] = {}
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            results[name] = (None, f"importing {name} took over {timeout:.0f} s")
            continue
        if proc.returncode != 0:
            lines = [line for line in err.strip().splitlines() if line.strip()]
            results[name] = (None, lines[-1] if lines else f"exit status {proc.returncode}")
        else:
            results[name] = (json.loads(out.strip().splitlines()[-1]), None)
    return results


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
