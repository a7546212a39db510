"""``python -m guide_utils doctor``: the first thing to run on a new machine or in a new job.

It reports the software stack (Python, PyTorch, torchvision, TensorFlow, Horovod and what
Horovod was built with), the MPI on the PATH, the GPUs, and, inside a Slurm job, the job's
shape; then it warns about each misconfiguration it can see. It exits non-zero only when
the stack cannot run the job at all, and says why.

Which job: ``--framework pytorch|tensorflow`` and ``--dist none|ddp|horovod|mwms``. A DDP or
MultiWorkerMirroredStrategy job needs no Horovod, so a missing Horovod is a problem only for
``--dist horovod``; and only what the job uses is probed (a PyTorch job never imports
TensorFlow), which keeps the doctor at the top of every batch job quick. Without
``--dist`` it checks the whole guide: PyTorch with every kind of distribution, and
TensorFlow as far as it is there.

The work is split so each part can be tested on its own: :func:`gather` reads the facts,
:func:`diagnose` turns facts into warnings and problems (a pure function), and
:func:`render` prints them.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from ..core.cli import ArgumentParser, one_line_errors
from ..core.errors import GuideError
from ..core.config import PROFILES, make_config
from ..runtime.slurm import SlurmJob

# The guide's DataLoader default (the thesis used 4 loader threads per worker, Appendix 5).
DEFAULT_LOADER_WORKERS = 4
EXPECTED = {"horovod": "0.28.1", "tensorflow": "2.15"}

# Each framework is probed in its own interpreter: a broken extension can crash the process
# that loads it, and the doctor must still report everything else.
_PROBES = {
    "torch": """
import json, torch, torchvision
gpus = []
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        gpus.append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1)})
print(json.dumps({"torch": torch.__version__, "torchvision": torchvision.__version__,
                  "torch_cuda": torch.version.cuda, "gpus": gpus}))
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
_HOROVOD_BINDINGS = {"pytorch": ("PyTorch", "horovod.torch"), "tensorflow": ("TensorFlow", "horovod.tensorflow")}
FRAMEWORKS = ("pytorch", "tensorflow")
DISTS = {"pytorch": ("none", "ddp", "horovod"), "tensorflow": ("none", "mwms", "horovod")}


@dataclass(frozen=True)
class Job:
    """What the job will run. ``None`` for both: the whole guide (PyTorch with every
    distribution; TensorFlow checked but optional)."""

    framework: str | None = None
    dist: str | None = None
    quick: bool = False  # probe no framework: only the Slurm job is checked

    def __post_init__(self):
        if self.framework is not None and self.framework not in FRAMEWORKS:
            raise GuideError(f"--framework must be one of {', '.join(FRAMEWORKS)}, got {self.framework!r}")
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
        names = {"torch": "pytorch" in self.frameworks, "tensorflow": "tensorflow" in self.frameworks,
                 "horovod": self.needs_horovod}
        code = dict(_PROBES)
        bindings = [_HOROVOD_BINDINGS[f] for f in self.frameworks]
        code["horovod"] = f"FRAMEWORKS = {bindings!r}\n" + code["horovod"]
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
    job: Job = field(default_factory=Job)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> list[dict[str, Any]]:
        if self.torch is not None:
            return self.torch.get("gpus", [])
        return [{"name": "GPU (seen by TensorFlow)", "memory_gib": "?"}] * (self.tensorflow or {}).get("gpus", 0)


@dataclass
class Diagnosis:
    warnings: list[str]
    problems: list[str]

    @property
    def usable(self) -> bool:
        return not self.problems


def _run_probes(probes: Mapping[str, str], timeout: float = 300) -> dict[str, tuple[dict[str, Any] | None, str | None]]:
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


def _mpi_version() -> str | None:
    mpirun = shutil.which("mpirun")
    if not mpirun:
        return None
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return f"{mpirun} (did not answer --version)"
    first = (out.stdout or out.stderr).strip().splitlines()
    return f"{first[0].strip()} ({mpirun})" if first else mpirun


def gather(env: Mapping[str, str] | None = None, loader_workers: int = DEFAULT_LOADER_WORKERS,
           job: Job | None = None) -> Facts:
    """Read the facts about this machine, the parts of its stack ``job`` uses, and its Slurm
    job (if any)."""
    env = os.environ if env is None else env
    job = job or Job()
    facts = Facts(loader_workers=loader_workers, omp_num_threads=env.get("OMP_NUM_THREADS"), job=job)
    for name, (result, error) in _run_probes(job.probes()).items():
        setattr(facts, name, result)
        if error:
            facts.errors[name] = error
    if job.needs_horovod and not job.quick:
        facts.mpi = _mpi_version()
    try:
        facts.slurm = SlurmJob.from_env(env)
    except GuideError as exc:
        facts.errors["slurm"] = str(exc)
    return facts


def diagnose(facts: Facts) -> Diagnosis:
    """Warnings for what will hurt; problems for what makes ``facts.job`` impossible."""
    warnings: list[str] = []
    problems: list[str] = []
    job, probed = facts.job, facts.job.probes()
    if "torch" in probed:
        problems += _torch_problems(facts)
    if "tensorflow" in probed:
        tf_problems = _tensorflow_problems(facts)
        # The whole guide runs without TensorFlow, less chapter 8: only then a warning.
        (warnings if job.whole_guide else problems).extend(tf_problems)
    if "horovod" in probed:
        hvd_problems, hvd_warnings = _horovod_findings(facts)
        problems += hvd_problems
        warnings += hvd_warnings
    if facts.gpus and facts.torch and not facts.torch.get("torch_cuda"):
        warnings.append("GPUs visible but this PyTorch is a CPU-only build")
    if "slurm" in facts.errors:
        warnings.append(f"the Slurm environment could not be read: {facts.errors['slurm']}")
    if facts.slurm is not None:
        warnings += diagnose_job(facts.slurm, loader_workers=facts.loader_workers,
                                 omp_num_threads=facts.omp_num_threads)
    return Diagnosis(warnings=warnings, problems=problems)


def _torch_problems(facts: Facts) -> list[str]:
    if facts.torch is None:
        return [f"PyTorch/torchvision do not import ({facts.errors.get('torch', 'unknown error')}); "
                "run scripts/setup.sh or load your site's PyTorch module"]
    return []


def _tensorflow_problems(facts: Facts) -> list[str]:
    tf = facts.tensorflow
    if tf is None:
        return [f"TensorFlow does not import ({facts.errors.get('tensorflow', 'unknown error')}): the TensorFlow "
                "chapters will not run; install tensorflow==2.15.1 (tensorflow-cpu without GPUs) and keras==2.15.0"]
    if not tf["tensorflow"].startswith(EXPECTED["tensorflow"]):
        return [f"TensorFlow {tf['tensorflow']} is not {EXPECTED['tensorflow']}: Horovod 0.28.1 does not build "
                "against 2.16+ (Keras 3); install tensorflow==2.15.1 and keras==2.15.0"]
    return []


def _horovod_findings(facts: Facts) -> tuple[list[str], list[str]]:
    """(problems, warnings) about Horovod, for a job that uses it."""
    hvd, job = facts.horovod, facts.job
    no_horovod = "--dist ddp" if "pytorch" in job.frameworks else "--dist mwms"
    if hvd is None:
        return [f"Horovod does not import ({facts.errors.get('horovod', 'unknown error')}); run scripts/setup.sh "
                f"to build it, or use {no_horovod}, which needs no Horovod"], []
    problems, warnings = [], []
    if hvd["controllers"] is not None and not any(hvd["controllers"].values()):
        problems.append("Horovod was built with neither MPI nor Gloo, so no job can start; "
                        "rebuild with HOROVOD_WITH_GLOO=1 (and HOROVOD_WITH_MPI=1)")
    for framework in job.frameworks:
        name, _ = _HOROVOD_BINDINGS[framework]
        if not hvd["frameworks"].get(name):
            other = no_horovod if framework == "pytorch" else "--dist mwms"
            message = (f"Horovod was built without {name} support; rebuild it after installing {name} "
                       f"(HOROVOD_WITH_{name.upper()}=1), or use {other}")
            # The whole guide needs Horovod for PyTorch; for TensorFlow only chapter 8 does.
            (warnings if job.whole_guide and framework == "tensorflow" else problems).append(message)
    if hvd["horovod"] != EXPECTED["horovod"]:
        warnings.append(f"Horovod {hvd['horovod']} is not the {EXPECTED['horovod']} this guide is tested with")
    if facts.gpus and hvd["operations"] is not None and not hvd["operations"].get("NCCL"):
        warnings.append(f"{len(facts.gpus)} GPU(s) visible but Horovod was built without NCCL: gradients "
                        "will be averaged through host memory; rebuild with HOROVOD_GPU_OPERATIONS=NCCL")
    return problems, warnings


def diagnose_job(job: SlurmJob, *, loader_workers: int = DEFAULT_LOADER_WORKERS,
                 omp_num_threads: str | None = None) -> list[str]:
    """Warnings about the shape of a Slurm job, independent of the software stack."""
    warnings: list[str] = []
    per_node = set(job.tasks_per_node)
    if job.gpus_per_node and per_node and per_node != {job.gpus_per_node}:
        warnings.append(f"tasks per node ({','.join(map(str, sorted(per_node)))}) differ from GPUs per node "
                        f"({job.gpus_per_node}): use one task per GPU (--ntasks-per-node={job.gpus_per_node})")
    if job.cpus_per_task is not None and loader_workers > job.cpus_per_task:
        warnings.append(f"{loader_workers} DataLoader workers per task but only {job.cpus_per_task} "
                        f"CPU(s) per task: ask for --cpus-per-task={loader_workers + 1} "
                        f"or use --loader-workers {max(job.cpus_per_task - 1, 0)}")
    if job.cpus_per_task is None and max(per_node or {1}) > 1:
        warnings.append("several tasks per node without --cpus-per-task: every task may start one "
                        "thread per core and oversubscribe the node")
    if max(per_node or {1}) > 1 and not omp_num_threads:
        warnings.append("OMP_NUM_THREADS is unset with several tasks per node: set it to the CPUs per task")
    return warnings


def _mark(flags: Mapping[str, bool] | None) -> str:
    if flags is None:
        return "unknown (no framework extension of Horovod loads)"
    return "  ".join(f"[{'X' if on else ' '}] {name}" for name, on in flags.items())


def render(facts: Facts, diagnosis: Diagnosis) -> str:
    """The report a person reads; one ``name: value`` line per fact."""
    probed, skipped = facts.job.probes(), facts.job.skipped()
    rows: list[tuple[str, str]] = [("host", facts.host), ("python", facts.python)]
    t = facts.torch
    if "torch" in probed:
        rows += [("torch", f"{t['torch']} (CUDA {t['torch_cuda'] or 'none'})" if t else "not usable"),
                 ("torchvision", t["torchvision"] if t else "not usable")]
    else:
        rows.append(("torch", skipped))
    tf = facts.tensorflow
    rows.append(("tensorflow", (f"{tf['tensorflow']} (Keras {tf['keras']})" if tf else "not usable")
                 if "tensorflow" in probed else skipped))
    h = facts.horovod
    if "horovod" not in probed:
        rows.append(("horovod", skipped))
    elif h:
        rows += [("horovod", h["horovod"]),
                 ("  frameworks", _mark(h["frameworks"])),
                 ("  controllers", _mark(h["controllers"])),
                 ("  tensor operations", _mark(h["operations"]))]
    else:
        rows.append(("horovod", "not usable"))
    if "horovod" in probed:
        rows.append(("mpi", facts.mpi or "none on PATH"))
    gpus = facts.gpus
    rows.append(("gpus", f"{len(gpus)} x {gpus[0]['name']} ({gpus[0]['memory_gib']} GiB)" if gpus
                 else skipped if facts.job.quick else "none"))
    job = facts.slurm
    if job is None:
        rows.append(("slurm job", "none (not inside a Slurm allocation)"))
    else:
        rows += [("slurm job", str(job.job_id)),
                 ("  nodes", f"{job.num_nodes}: {','.join(job.nodes)}"),
                 ("  tasks", str(job.ntasks)),
                 ("  tasks per node", ",".join(map(str, job.tasks_per_node)) or "unknown"),
                 ("  cpus per task", str(job.cpus_per_task) if job.cpus_per_task is not None else "unset"),
                 ("  gpus per node", str(job.gpus_per_node) if job.gpus_per_node is not None else "none requested"),
                 ("  rendezvous", "%s:%d" % job.rendezvous() if job.nodes else "unknown")]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name.ljust(width)}  {value}" for name, value in rows]
    lines += [f"WARNING: {w}" for w in diagnosis.warnings]
    lines += [f"PROBLEM: {p}" for p in diagnosis.problems]
    verdict = "not checked (--quick)" if facts.job.quick else "yes" if diagnosis.usable else "NO"
    lines.append(f"stack usable: {verdict} (for {facts.job.describe()})")
    return "\n".join(lines)


PROG = "python -m guide_utils doctor"


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog=PROG,
                            description="Report the software stack, GPUs and Slurm job, and warn about "
                                        "misconfigurations. Exit status 1 when the stack cannot run the job.")
    parser.add_argument("--framework", choices=FRAMEWORKS,
                        help="the job's framework (default: check the whole guide)")
    parser.add_argument("--dist", choices=sorted({*DISTS["pytorch"], *DISTS["tensorflow"]}),
                        help="the job's --dist; Horovod is needed only for horovod (default: the whole guide)")
    parser.add_argument("--loader-workers", type=int, default=None,
                        help=f"DataLoader workers per task you plan to use (default: the --profile's, "
                             f"{DEFAULT_LOADER_WORKERS} for full)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full",
                        help="training profile the job will run (sets the loader-worker default)")
    parser.add_argument("--quick", action="store_true",
                        help="check only the Slurm job, not the frameworks (each framework probe starts an "
                             "interpreter: seconds of CPU; for CI jobs on a stack checked once per run)")
    parser.add_argument("--json", action="store_true", help="print the facts and diagnosis as JSON")
    args = parser.parse_args(argv)
    if args.loader_workers is None:
        args.loader_workers = make_config(args.profile).loader_workers
    job = Job(args.framework or ("pytorch" if args.dist in ("ddp", "none") else
                                 "tensorflow" if args.dist == "mwms" else None), args.dist, quick=args.quick)
    facts = gather(loader_workers=args.loader_workers, job=job)
    diagnosis = diagnose(facts)
    if args.json:
        data = asdict(facts)
        data["slurm"] = asdict(facts.slurm) if facts.slurm else None
        print(json.dumps({"facts": data, "warnings": diagnosis.warnings, "problems": diagnosis.problems}, indent=2))
    else:
        print(render(facts, diagnosis))
    return 0 if diagnosis.usable else 1


if __name__ == "__main__":
    sys.exit(main())
