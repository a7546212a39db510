"""Which GPUs a process may use, and which of them a rank takes: one rule, shared by the
engine (``engine.distributed``) and the per-task check (``cluster.doctor.tasks``), so that
the check judges the GPU the training will really use. No torch here: the check runs in
every task of a job and must start at once.

Slurm's GRES plugin (and a launcher, or the user) names the GPUs in a device list:
``CUDA_VISIBLE_DEVICES`` on NVIDIA nodes, ``ROCR_VISIBLE_DEVICES`` or ``HIP_VISIBLE_DEVICES``
on AMD ones; a process sees only those, numbered from 0.

>>> visible_devices({"CUDA_VISIBLE_DEVICES": "0,1"}), visible_devices({"ROCR_VISIBLE_DEVICES": "2"})
(['0', '1'], ['2'])
>>> visible_devices({"CUDA_VISIBLE_DEVICES": ""}), visible_devices({}) is None
([], True)
>>> [device_index(local_rank, 2) for local_rank in range(4)]
[0, 1, 0, 1]

A step whose GPUs are asked per task but not bound to the tasks (``--gpus-per-task=1
--gpu-bind=none``, NERSC's way) gets no device list at all from Slurm 22.05: each task sees the
node's GPUs of the step, which Slurm counts in ``SLURM_GPUS_ON_NODE`` (a step started without
GPUs, ``--gres=none``, has no count), and picks its own by local rank.

>>> usable_devices({"SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_GPUS": "0,1,2,3"})
['0', '1', '2', '3']
>>> usable_devices({"SLURM_JOB_GPUS": "0,1"}) is None, usable_devices({"CUDA_VISIBLE_DEVICES": "3"})
(True, ['3'])

Whether the job gave this process GPUs at all (what a framework that sees none must not
ignore: the doctor and the TensorFlow door refuse to train on the CPU then):

>>> allocated({"CUDA_VISIBLE_DEVICES": "0,1"})
'CUDA_VISIBLE_DEVICES=0,1'
>>> allocated({"SLURM_GPUS_ON_NODE": "0", "CUDA_VISIBLE_DEVICES": ""}) is None
True
"""

from __future__ import annotations

import os
import re
from typing import Mapping

# Device lists, in the order the first one set wins (CUDA's is also what HIP reads).
VISIBLE = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
# What a node with GPUs has loaded: NVIDIA's kernel driver, AMD's (ROCm's) compute device.
ROCM_DRIVER = "dev/kfd"
GPU_DRIVERS = ("/proc/driver/nvidia", "/" + ROCM_DRIVER)


def rocm_driver(root: str = "/") -> bool:
    """Whether this node has ROCm's compute driver (/dev/kfd under ``root``): AMD GPUs."""
    return os.path.exists(os.path.join(root, ROCM_DRIVER))

# Values that hide every GPU: Slurm writes NoDevFiles for a step without GPUs; CUDA stops at -1.
NO_DEVICES = ("", "-1", "NoDevFiles")
# Variables that give a process GPUs: device lists (launchers and Slurm's GRES plugin set
# them), then Slurm's counts. The first that names a GPU is the one a message quotes.
DEVICE_LISTS = (*VISIBLE, "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
COUNTS = ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_TASK", "SLURM_GPUS_PER_NODE", "SLURM_GPUS")


def device_variable(env: Mapping[str, str]) -> str | None:
    """The name of the first device list that is set in ``env`` (even to nothing); None if none is."""
    return next((name for name in VISIBLE if name in env), None)


def visible_devices(env: Mapping[str, str]) -> list[str] | None:
    """The GPUs this process may use, as its device list names them: [] when the list hides
    them all, None when no list is set (the process sees every GPU of the node)."""
    name = device_variable(env)
    if name is None:
        return None
    value = env[name].strip()
    return [] if value in NO_DEVICES else [d.strip() for d in value.split(",") if d.strip()]


def device_index(local_rank: int, count: int) -> int:
    """Which of ``count`` visible GPUs the rank with ``local_rank`` on its node uses: its own
    when every task of the node sees all of them, GPU 0 when each task sees only its own
    (srun --gpus-per-task or --gpu-bind set the device list per task)."""
    if count < 1:
        raise ValueError(f"no GPU to choose from (count={count})")
    return local_rank % count


def usable_devices(env: Mapping[str, str]) -> list[str] | None:
    """The GPUs this process may use: its device list's, else (no list: every GPU of the step on
    this node is visible) as many as ``SLURM_GPUS_ON_NODE`` counts, numbered from 0 as CUDA and
    ROCm number them where the site confines a job to its own devices (cgroups; a node shared
    without that would show the others' GPUs too). None when neither says: no GPU known."""
    visible = visible_devices(env)
    if visible is not None:
        return visible
    count = env.get("SLURM_GPUS_ON_NODE", "").strip()
    return [str(i) for i in range(int(count))] if count.isdigit() and int(count) > 0 else None


def allocated(env: Mapping[str, str]) -> str | None:
    """``NAME=value`` of the first variable that gives this process a GPU; None if none does."""
    for name in DEVICE_LISTS:
        value = env.get(name, "").strip()
        if value not in NO_DEVICES:
            return f"{name}={value}"
    for name in COUNTS:  # "4", "gpu:4", "v100:4", "gpu:a100:2(x2)": any count above zero
        value = env.get(name, "").strip()
        if any(int(n) > 0 for n in re.findall(r"(?:^|[:,])(\d+)", value)):
            return f"{name}={value}"
    return None
