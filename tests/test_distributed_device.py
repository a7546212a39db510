"""The PyTorch engine's device when this PyTorch sees no GPU: the CPU where the job gave the
process none (a laptop, CI), a one-line refusal where it did (a CPU-only wheel on a GPU job
whose doctor ran --quick), as the doctor and the TensorFlow door refuse."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from guide_utils.core.errors import GuideError  # noqa: E402
from guide_utils.engine import distributed  # noqa: E402
from guide_utils.runtime.gpus import COUNTS, DEVICE_LISTS  # noqa: E402


@pytest.fixture
def no_gpu(monkeypatch):
    """This PyTorch sees no GPU, and nothing in the environment gives the process one."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in (*DEVICE_LISTS, *COUNTS, "GUIDE_FAKE_GPUS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_without_gpus_in_the_job_the_engine_trains_on_the_cpu(no_gpu):
    assert distributed._pick_device(0) == torch.device("cpu")
    no_gpu.setenv("CUDA_VISIBLE_DEVICES", "")  # a site that hides the GPUs from CPU jobs
    no_gpu.setenv("SLURM_GPUS_ON_NODE", "0")
    assert distributed.init("none").device == torch.device("cpu")


@pytest.mark.parametrize("variable, value, wanted", [
    ("CUDA_VISIBLE_DEVICES", "0,1", "a PyTorch built for these GPUs"),
    ("ROCR_VISIBLE_DEVICES", "0,1,2,3", "a ROCm build of PyTorch"),
    ("SLURM_GPUS_ON_NODE", "4", "a PyTorch built for these GPUs"),  # --gpus-per-task with --gpu-bind=none
])
def test_gpus_this_pytorch_does_not_see_are_refused_in_one_line(no_gpu, variable, value, wanted):
    no_gpu.setenv(variable, value)
    with pytest.raises(GuideError) as caught:
        distributed._pick_device(1)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"the job has GPUs ({variable}={value}) but this PyTorch "
                                                      f"{torch.__version__} (")
    assert "sees none; refusing to train on the CPU" in message and f"install {wanted}" in message
    with pytest.raises(GuideError, match=r"CPU-only build\) sees none"):
        distributed.refuse_cpu_on_gpus({variable: value}, "2.5.1", type("v", (), {"cuda": None, "hip": None}))
    # The tests' Slurm gives its jobs fake GPUs (device files, no GPU) and says so: they train on the CPU.
    no_gpu.setenv("GUIDE_FAKE_GPUS", "1")
    assert distributed._pick_device(1) == torch.device("cpu")
    assert os.environ[variable] == value
    # ... but never where a GPU driver is loaded: there the GPUs are real, and the job stops.
    no_gpu.setattr(distributed, "GPU_DRIVERS", (str(Path(__file__)),))
    with pytest.raises(GuideError, match="sees none; refusing to train on the CPU"):
        distributed._pick_device(1)
