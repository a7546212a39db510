"""What the doctor looks at: the job it checks (:class:`Job`: framework and distribution,
which decide the probes) and the facts it gathers about this machine (:class:`Facts`).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from typing import Any, Mapping

from ...core.errors import GuideError
from ...runtime.gpus import COUNTS, DEVICE_LISTS, rocm_driver
from ...runtime.slurm import SlurmJob
from .network import ofi_plugin, slingshot
from .probes import HOROVOD_BINDINGS, PROBES, merge_horovod, mpi_version, run_probes

# The guide's DataLoader default (the thesis used 4 loader threads per worker, Appendix 5).
DEFAULT_LOADER_WORKERS = 4
FRAMEWORKS = ("pytorch", "tensorflow")
DISTS = {"pytorch": ("none", "ddp", "horovod"), "tensorflow": ("none", "mwms", "horovod")}
# How the job starts its processes (lib/guide.sh's guide_setup): srun starts each (tasks), one
# launcher per node (node), or a launcher in the batch shell (shell: horovodrun, mpirun).
LAUNCHES = ("tasks", "node", "shell")


@dataclass(frozen=True)
class Job:
    """What the job will run. ``None`` for both: the whole guide (PyTorch with every
    distribution; TensorFlow checked but optional)."""

    framework: str | None = None
    dist: str | None = None
    quick: bool = False  # probe no framework: only the Slurm job is checked
    launch: str | None = None  # one of LAUNCHES; None: not said

    def __post_init__(self):
        if self.framework is not None and self.framework not in FRAMEWORKS:
            raise GuideError(f"--framework must be one of {', '.join(FRAMEWORKS)}, got {self.framework!r}")
        if self.launch is not None and self.launch not in LAUNCHES:
            raise GuideError(f"--launch must be one of {', '.join(LAUNCHES)}, got {self.launch!r}")
        allowed = (DISTS[self.framework or "pytorch"] if self.framework
                   else sorted({*DISTS["pytorch"], *DISTS["tensorflow"]}))
        if self.dist is not None and self.dist not in allowed:
            raise GuideError(f"--dist {self.dist} does not go with --framework {self.framework or 'pytorch'}; "
                             f"choose from {', '.join(allowed)}")

    @property
    def whole_guide(self) -> bool:
        return self.framework is None and self.dist is None

    @property
    def frameworks(self) -> tuple[str, ...]:
        """Frameworks the job uses (the whole guide: both)."""
        if self.framework:
            return (self.framework,)
        return ("tensorflow",) if self.dist == "mwms" else FRAMEWORKS if self.dist is None else ("pytorch",)

    @property
    def needs_horovod(self) -> bool:
        return self.dist in (None, "horovod")

    def probes(self) -> dict[str, str]:
        """The probe programs this job needs, by name (none when quick)."""
        if self.quick:
            return {}
        both = len(self.frameworks) > 1
        names = {"torch": "pytorch" in self.frameworks, "tensorflow": "tensorflow" in self.frameworks,
                 "horovod": self.needs_horovod, "horovod_tf": self.needs_horovod and both}
        code = dict(PROBES)
        # each binding after its own framework (probes.merge_horovod joins them)
        code["horovod"] = f"FRAMEWORKS = {[HOROVOD_BINDINGS[self.frameworks[0]]]!r}\n" + PROBES["horovod"]
        code["horovod_tf"] = f"FRAMEWORKS = {[HOROVOD_BINDINGS['tensorflow']]!r}\n" + PROBES["horovod"]
        return {name: code[name] for name, wanted in names.items() if wanted}

    def describe(self) -> str:
        if self.whole_guide:
            return "the whole guide"
        return f"--framework {self.frameworks[0]}" + (f" --dist {self.dist}" if self.dist else "")

    def skipped(self) -> str:
        """How the report shows a part of the stack that was not probed."""
        return "not checked (--quick)" if self.quick else f"not checked (not used by {self.describe()})"


@dataclass
class Facts:
    """Everything the doctor looked at. Missing pieces are ``None`` with an ``errors`` entry."""

    python: str = platform.python_version()
    host: str = platform.node()
    torch: dict[str, Any] | None = None
    tensorflow: dict[str, Any] | None = None
    horovod: dict[str, Any] | None = None
    mpi: str | None = None
    slurm: SlurmJob | None = None
    loader_workers: int = DEFAULT_LOADER_WORKERS
    omp_num_threads: str | None = None
    gpu_env: dict[str, str] = field(default_factory=dict)  # the variables that give this process GPUs
    slingshot: str | None = None  # what shows this node is on HPE Slingshot (probes.slingshot); None: not
    ofi_plugin: str | None = None  # the NCCL/RCCL OFI (libfabric) plugin NCCL would load; None: none found
    rocm_driver: bool = False  # this node has ROCm's driver (gpus.rocm_driver): AMD GPUs, a ROCm build's fix
    job: Job = field(default_factory=Job)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> list[dict[str, Any]]:
        if self.torch is not None:
            return self.torch.get("gpus", [])
        return [{"name": "GPU (seen by TensorFlow)", "memory_gib": "?"}] * (self.tensorflow or {}).get("gpus", 0)


def gather(env: Mapping[str, str] | None = None, loader_workers: int = DEFAULT_LOADER_WORKERS,
           job: Job | None = None, root: str = "/") -> Facts:
    """Read the facts about this machine (its /sys under ``root``), the parts of its stack
    ``job`` uses, and its Slurm job (if any)."""
    env = os.environ if env is None else env
    job = job or Job()
    gpu_vars = (*DEVICE_LISTS, *COUNTS)
    facts = Facts(loader_workers=loader_workers, omp_num_threads=env.get("OMP_NUM_THREADS"), job=job,
                  gpu_env={k: env[k] for k in gpu_vars if k in env}, slingshot=slingshot(root),
                  ofi_plugin=ofi_plugin(env, root), rocm_driver=rocm_driver(root))
    results = run_probes(job.probes())
    merge_horovod(results)
    for name, (result, error) in results.items():
        setattr(facts, name, result)
        if error:
            facts.errors[name] = error
    if job.needs_horovod and not job.quick:
        facts.mpi = mpi_version()
    try:
        facts.slurm = SlurmJob.from_env(env)
    except GuideError as exc:
        facts.errors["slurm"] = str(exc)
    return facts
