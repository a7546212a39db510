"""The doctor on a GPU node: GPUs the job was given that this PyTorch (or TensorFlow) cannot use.

Two ways a GPU job silently trains on the CPU or fails at its first kernel: a PyTorch build
for no GPU, or for the other vendor (the allocation names GPUs, ``torch.cuda`` sees none),
and a CUDA build without kernels for the GPU's architecture (recent CUDA wheels leave out
sm_70 and older: V100, P100), which fails with "no kernel image is available".

>>> allocated({"CUDA_VISIBLE_DEVICES": "0,1"})
'CUDA_VISIBLE_DEVICES=0,1'
>>> allocated({"SLURM_GPUS_ON_NODE": "0", "CUDA_VISIBLE_DEVICES": ""}) is None
True
>>> runs_on("sm_86", ["sm_80", "sm_90"]), runs_on("sm_70", ["sm_75", "sm_80"]), runs_on("sm_70", ["compute_60"])
(True, False, True)

The same two on AMD GPUs and on the driver: a ROCm build has code objects for a list of gfx
targets only (an MI250X GCD is gfx90a; ``gcnArchName`` adds features after a colon), and a
CUDA build needs a driver that supports its CUDA major version.

>>> gfx_target("gfx90a:sramecc+:xnack-"), runs_on_gfx("gfx90a:sramecc+:xnack-", ["gfx908", "gfx90a", "gfx942"])
('gfx90a', True)
>>> driver_supports(12040, "12.6"), driver_supports(11080, "12.1"), driver_supports(None, "12.1")
(True, False, True)
"""

from __future__ import annotations

from typing import Any, Mapping

from ...runtime.gpus import NO_DEVICES, VISIBLE, allocated

AMD = VISIBLE[1:]


def amd_gpus(env: Mapping[str, str], driver: bool = False) -> bool:
    """Whether the job's GPUs are AMD's: the node has ROCm's driver (``driver``:
    :func:`rocm_driver`), or ROCm's own device lists give this process GPUs (Slurm's GRES sets
    them on AMD nodes beside CUDA_VISIBLE_DEVICES). Not the first variable that names a GPU:
    on an AMD node that is often CUDA_VISIBLE_DEVICES."""
    return driver or any(env.get(name, "").strip() not in NO_DEVICES for name in AMD)
WHERE = "the Slurm chapter's 'Which PyTorch for which GPU'"
TF_WHERE = "docs/usage.md, 'Running on a real cluster'"


def runs_on(capability: str, arch_list: list[str]) -> bool:
    """Whether a CUDA build for ``arch_list`` has kernels for a GPU of ``capability`` (sm_XY):
    its own binary, one of the same major and an older minor, or PTX of an older capability
    that the driver compiles."""
    major, minor = int(capability[3:-1]), int(capability[-1])
    for arch in arch_list:
        kind, _, number = arch.partition("_")
        if not number.isdigit():
            continue
        a_major, a_minor = int(number[:-1]), int(number[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def gfx_target(arch_name: str) -> str:
    """The gfx target of a ``gcnArchName`` ("gfx90a:sramecc+:xnack-" -> "gfx90a")."""
    return arch_name.split(":", 1)[0].strip()


def runs_on_gfx(arch_name: str, arch_list: list[str]) -> bool:
    """Whether a ROCm build for ``arch_list`` has code objects for a GPU of ``arch_name``."""
    return gfx_target(arch_name) in {gfx_target(a) for a in arch_list}


def driver_supports(driver: int | None, torch_cuda: str | None) -> bool:
    """Whether a driver that supports CUDA ``driver`` (cudaDriverGetVersion: 12040 = 12.4) runs a
    build for CUDA ``torch_cuda``: from CUDA 11 on, any driver of the same major version does
    (minor version compatibility); an older major does not. Unknown values pass."""
    if not driver or not torch_cuda or not torch_cuda.split(".")[0].isdigit():
        return True
    return driver // 1000 >= int(torch_cuda.split(".")[0])


def _rocm_and_driver_problems(torch: dict[str, Any]) -> list[str]:
    problems = []
    driver, cuda = torch.get("cuda_driver"), torch.get("torch_cuda")
    if not driver_supports(driver, cuda):
        problems.append(f"the NVIDIA driver supports CUDA up to {driver // 1000}.{driver % 1000 // 10}, but this "
                        f"PyTorch {torch['torch']} is built for CUDA {cuda}: CUDA does not start ('driver too "
                        f"old'); install a PyTorch for CUDA {driver // 1000}.x or load the site's module ({WHERE})")
    arch = torch.get("arch_list") or []
    for index, gpu in enumerate(torch.get("gpus") or []):
        gfx = gpu.get("gfx")
        if gfx and arch and torch.get("torch_hip") and not runs_on_gfx(gfx, arch):
            problems.append(f"GPU {index} ({gpu['name']}, {gfx_target(gfx)}) is not among this PyTorch's ROCm "
                            f"targets ({' '.join(arch)}): its first kernel fails (no code object for "
                            f"{gfx_target(gfx)}); install a ROCm build of PyTorch for it or the site's module "
                            f"({WHERE})")
    return problems


def gpu_problems(torch: dict[str, Any] | None, env: Mapping[str, str], driver: bool = False) -> list[str]:
    """Problems: GPUs in the allocation that this PyTorch (the torch probe's facts) cannot use;
    ``driver``: the node has ROCm's driver (:func:`rocm_driver`)."""
    if torch is None:
        return []
    problems = []
    given = allocated(env)
    if given and not torch.get("gpus"):
        build = (f"ROCm {torch['torch_hip']}" if torch.get("torch_hip") else
                 f"CUDA {torch['torch_cuda']}" if torch.get("torch_cuda") else "CPU-only")
        wanted = "a ROCm build of PyTorch" if amd_gpus(env, driver) else "a PyTorch built for these GPUs"
        problems.append(f"the job has GPUs ({given}) but this PyTorch {torch['torch']} ({build} build) sees none, so "
                        f"it would train on the CPU; install {wanted} or load the site's PyTorch module ({WHERE})")
    arch = torch.get("arch_list") or []
    for index, gpu in enumerate(torch.get("gpus") or []):
        cap = gpu.get("capability")
        if cap and arch and not torch.get("torch_hip") and not runs_on(cap, arch):
            problems.append(f"GPU {index} ({gpu['name']}, {cap}) is not among this PyTorch's CUDA architectures "
                            f"({' '.join(arch)}): its first kernel fails with 'no kernel image is available'; "
                            f"install a PyTorch built for {cap} (an older CUDA's index) or the site's module ({WHERE})")
    return problems + _rocm_and_driver_problems(torch)


def tensorflow_gpu_problems(tf: dict[str, Any] | None, env: Mapping[str, str], driver: bool = False) -> list[str]:
    """Problems: GPUs in the allocation that this TensorFlow (the tensorflow probe's facts) does
    not see. The guide's lock pins tensorflow-cpu (the laptop and CI set-up), which sees none
    anywhere: on a GPU job it would train on the CPU, with the RING collective under MWMS."""
    given = allocated(env)
    if tf is None or not given or tf.get("gpus"):
        return []
    build = tf.get("build") or "unknown"
    wanted = ("a ROCm build of TensorFlow 2.15 (AMD's tensorflow-rocm)" if amd_gpus(env, driver) else
              "tensorflow==2.15.1 (the GPU wheel; its [and-cuda] extra brings CUDA) instead of tensorflow-cpu")
    return [f"the job has GPUs ({given}) but this TensorFlow {tf['tensorflow']} ({build} build) sees none, so it "
            f"would train on the CPU; install {wanted} or load the site's TensorFlow module ({TF_WHERE})"]
