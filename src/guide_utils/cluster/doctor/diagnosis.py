"""The doctor's judgement, a pure function of the facts: warnings for what will hurt,
problems for what makes the job impossible.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...runtime.slurm import SlurmJob
from .facts import DEFAULT_LOADER_WORKERS, Facts
from .gpus import allocated, gpu_problems, tensorflow_gpu_problems
from .probes import HOROVOD_BINDINGS

# The versions the guide is tested with: Horovod 0.28.1 builds against TensorFlow 2.15 at most.
EXPECTED = {"horovod": "0.28.1", "tensorflow": "2.15"}


@dataclass
class Diagnosis:
    """What :func:`diagnose` found; the stack is usable when there are no problems."""

    warnings: list[str]
    problems: list[str]

    @property
    def usable(self) -> bool:
        return not self.problems


def diagnose(facts: Facts) -> Diagnosis:
    """Warnings for what will hurt; problems for what makes ``facts.job`` impossible."""
    warnings: list[str] = []
    problems: list[str] = []
    job, probed = facts.job, facts.job.probes()
    if "torch" in probed:
        problems += _torch_problems(facts) + gpu_problems(facts.torch, facts.gpu_env, facts.rocm_driver)
    if "tensorflow" in probed:
        tf_problems, tf_warnings = _tensorflow_findings(facts)
        tf_problems += tensorflow_gpu_problems(facts.tensorflow, facts.gpu_env, facts.rocm_driver)
        # The whole guide runs without TensorFlow, less chapter 8: only then a warning.
        (warnings if job.whole_guide else problems).extend(tf_problems)
        warnings += tf_warnings
    if "horovod" in probed:
        hvd_problems, hvd_warnings = _horovod_findings(facts)
        problems += hvd_problems
        warnings += hvd_warnings
    if facts.gpus and facts.torch and not facts.torch.get("torch_cuda"):
        warnings.append("GPUs visible but this PyTorch is a CPU-only build")
    if facts.slingshot and not facts.ofi_plugin and job.dist != "none" and allocated(facts.gpu_env):
        warnings.append(f"this node is on HPE Slingshot ({facts.slingshot}) but NCCL would find no libfabric (OFI) "
                        "plugin (libnccl-net.so, RCCL: librccl-net.so; none on LD_LIBRARY_PATH, no NCCL_NET_PLUGIN), "
                        "so it would use TCP sockets between nodes; load the site's aws-ofi-nccl module, or in an "
                        "image bind the host's (GUIDE_APPTAINER_NET_LIBS in the site profile)")
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


def _tensorflow_findings(facts: Facts) -> tuple[list[str], list[str]]:
    """(problems, warnings) about TensorFlow. Its version matters only to Horovod, which
    does not build against 2.16+ (Keras 3): without Horovod another version is a warning."""
    tf = facts.tensorflow
    if tf is None:
        return [f"TensorFlow does not import ({facts.errors.get('tensorflow', 'unknown error')}): the TensorFlow "
                "chapters will not run; install tensorflow==2.15.1 (tensorflow-cpu without GPUs) and keras==2.15.0"], []
    if tf["tensorflow"].startswith(EXPECTED["tensorflow"]):
        return [], []
    if facts.job.needs_horovod:
        return [f"TensorFlow {tf['tensorflow']} is not {EXPECTED['tensorflow']}: Horovod 0.28.1 does not build "
                "against 2.16+ (Keras 3); install tensorflow==2.15.1 and keras==2.15.0"], []
    return [], [f"TensorFlow {tf['tensorflow']} is not the {EXPECTED['tensorflow']} this guide is tested with "
                "(it matters to Horovod only; this job does not use it)"]


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
        name, _ = HOROVOD_BINDINGS[framework]
        if not hvd["frameworks"].get(name):
            other = no_horovod if framework == "pytorch" else "--dist mwms"
            message = (f"Horovod was built without {name} support; rebuild it after installing {name} "
                       f"(HOROVOD_WITH_{name.upper()}=1), or use {other}")
            # The whole guide needs Horovod for PyTorch; for TensorFlow only chapter 8 does.
            (warnings if job.whole_guide and framework == "tensorflow" else problems).append(message)
    if hvd["horovod"] != EXPECTED["horovod"]:
        warnings.append(f"Horovod {hvd['horovod']} is not the {EXPECTED['horovod']} this guide is tested with")
    if facts.gpus and hvd["operations"] is not None and not hvd["operations"].get("NCCL"):
        # A Horovod job on GPUs would average every gradient through host memory: it runs, slowly.
        message = (f"{len(facts.gpus)} GPU(s) visible but Horovod was built without NCCL: gradients "
                   "would be averaged through host memory; rebuild with HOROVOD_GPU_OPERATIONS=NCCL")
        if job.dist == "horovod":
            problems.append(f"{message} (docs/usage.md, 'Running on a real cluster'), or use {no_horovod} "
                            f"(GUIDE_HOROVOD=no in the site profile makes DDP the scripts' default)")
        else:
            warnings.append(message)
    if job.dist == "horovod" and job.launch == "tasks" and hvd["controllers"] and not hvd["controllers"]["MPI"]:
        # Without MPI, hvd.init() in a task srun started finds no horovodrun rendezvous and makes
        # a world of one process (Horovod's Gloo context): the ranks train apart, or the world
        # size check stops them after the queue.
        problems.append("Horovod was built without MPI, but srun starts this job's ranks through its MPI plugin, "
                        "which only Horovod's MPI controller joins (each rank would start a world of its own); "
                        "rebuild Horovod with HOROVOD_WITH_MPI=1 against the site's MPI (horovodrun --check-build "
                        f"then ticks MPI), or use {no_horovod}")
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
