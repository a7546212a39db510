"""The site profiles of ``slurm_examples/sites/`` read from Python, and what follows from them.

A site profile is a bash file, checked by ``slurm_examples/lib/guide.sh``; it is read here
by that same library (``guide_load_site``), so Python and the sbatch examples accept and
refuse exactly the same profiles with the same one-line messages. Interactive engines
(``guide_utils.cluster.interactive``) are submitted with a batch script built from it:
the account, partition, tasks and GPUs per node, CPUs per task and extra sbatch options
of the profile, and its software set-up (venv, modules or container), as every example.

>>> EXAMPLE.sbatch_options(6)
['--nodes=2', '--ntasks=6', '--ntasks-per-node=4', '--cpus-per-task=8', '--partition=gpu', '--gres=gpu:v100:4']
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field, replace

from ..core.errors import GuideError
from ..core.paths import repo_root

VALUES = ("GUIDE_ACCOUNT", "GUIDE_PARTITION", "GUIDE_TASKS_PER_NODE", "GUIDE_CPUS_PER_TASK", "GUIDE_GPU_REQUEST",
          "GUIDE_SOFTWARE", "GUIDE_SRUN_MPI", "GUIDE_TRAIN_PROFILE")
# Print the checked profile's values, NUL-separated; arrays one element per entry.
_DUMP = r"""
source "$GUIDE_ROOT/slurm_examples/lib/guide.sh"
guide_load_site
for v in GUIDE_SITE_FILE "${VALUES[@]}"; do printf '%s=%s\0' "$v" "${!v}"; done
for x in ${GUIDE_SBATCH_EXTRA[@]+"${GUIDE_SBATCH_EXTRA[@]}"}; do printf 'GUIDE_SBATCH_EXTRA=%s\0' "$x"; done
for x in ${GUIDE_SHARED_SBATCH[@]+"${GUIDE_SHARED_SBATCH[@]}"}; do printf 'GUIDE_SHARED_SBATCH=%s\0' "$x"; done
"""


@dataclass(frozen=True)
class Site:
    file: str
    name: str
    account: str
    partition: str
    tasks_per_node: int
    cpus_per_task: int
    gpu_request: str
    software: str
    srun_mpi: str
    train_profile: str
    sbatch_extra: tuple[str, ...] = field(default_factory=tuple)
    shared_sbatch: tuple[str, ...] = field(default_factory=tuple)  # a job smaller than a node: instead

    def nodes_for(self, n: int) -> int:
        return math.ceil(n / self.tasks_per_node)

    def sbatch_options(self, n: int) -> list[str]:
        """The sbatch options for ``n`` tasks, one per GPU, as ``submit.sh`` would give them (a
        job smaller than a node: the profile's options for shared nodes instead of its partition
        and extras, where it has them).

        >>> replace(EXAMPLE, shared_sbatch=("--qos=shared",)).sbatch_options(2)[-2:]
        ['--gres=gpu:v100:2', '--qos=shared']
        """
        per_node = min(n, self.tasks_per_node)
        shared = bool(self.shared_sbatch) and n < self.tasks_per_node
        opts = [f"--nodes={self.nodes_for(n)}", f"--ntasks={n}", f"--ntasks-per-node={per_node}",
                f"--cpus-per-task={self.cpus_per_task}"]
        opts += [f"--account={self.account}"] if self.account else []
        opts += [f"--partition={self.partition}"] if self.partition and not shared else []
        opts += [self.gpu_option(per_node)] if self.gpu_request else []
        return opts + list(self.shared_sbatch if shared else self.sbatch_extra)

    def gpu_option(self, per_node: int) -> str:
        """The GPU request for ``per_node`` tasks per node: a count per node where the profile
        has ``%d``, else its per-task request as it is (as lib/guide.sh's guide_gpu_option).

        >>> replace(EXAMPLE, gpu_request="--gpus-per-task=1").gpu_option(4)
        '--gpus-per-task=1'
        """
        return self.gpu_request % per_node if "%d" in self.gpu_request else self.gpu_request


EXAMPLE = Site(file="x.sh", name="x", account="", partition="gpu", tasks_per_node=4, cpus_per_task=8,
               gpu_request="--gres=gpu:v100:%d", software="venv", srun_mpi="pmix", train_profile="full")


def read_site(site: str | None = None) -> Site:
    """The checked profile named ``site`` (a name under slurm_examples/sites/ or a path;
    default $GUIDE_SITE). A profile the examples would refuse raises their one line."""
    site = site or os.environ.get("GUIDE_SITE")
    if not site:
        raise GuideError("no site profile: pass site='NAME' (one of slurm_examples/sites/) or set GUIDE_SITE")
    root = repo_root()
    env = {**os.environ, "GUIDE_ROOT": str(root), "GUIDE_SITE": site}
    script = f"VALUES=({' '.join(VALUES)})\n{_DUMP}"
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, timeout=60)
    if out.returncode != 0:
        lines = out.stderr.decode(errors="replace").strip().splitlines() or [f"bash exited {out.returncode}"]
        raise GuideError(lines[-1].removeprefix("error: "))
    values: dict[str, str] = {}
    lists: dict[str, list[str]] = {"GUIDE_SBATCH_EXTRA": [], "GUIDE_SHARED_SBATCH": []}
    for item in out.stdout.decode().split("\0"):
        if "=" in item:
            name, value = item.split("=", 1)
            lists[name].append(value) if name in lists else values.__setitem__(name, value)
    return Site(file=values["GUIDE_SITE_FILE"], name=site, account=values["GUIDE_ACCOUNT"],
                partition=values["GUIDE_PARTITION"], tasks_per_node=int(values["GUIDE_TASKS_PER_NODE"]),
                cpus_per_task=int(values["GUIDE_CPUS_PER_TASK"]), gpu_request=values["GUIDE_GPU_REQUEST"],
                software=values["GUIDE_SOFTWARE"], srun_mpi=values["GUIDE_SRUN_MPI"],
                train_profile=values["GUIDE_TRAIN_PROFILE"], sbatch_extra=tuple(lists["GUIDE_SBATCH_EXTRA"]),
                shared_sbatch=tuple(lists["GUIDE_SHARED_SBATCH"]))


def check_against_cluster(site: Site, n: int) -> None:
    """Refuse, in one line, a partition the cluster does not have and more engines than its
    nodes can hold at the profile's tasks per node (asks ``sinfo``; skipped without it)."""
    if not shutil.which("sinfo"):
        raise GuideError("sinfo not found: Slurm-launched engines need a Slurm login or compute node; "
                         "on this machine use engines='mpi'")
    cmd = ["sinfo", "-h", "-o", "%P %D"]  # %P marks the default partition with a *
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise GuideError(f"sinfo failed ({out.stderr.strip() or out.returncode}); is Slurm reachable from here?")
    nodes: dict[str, int] = {}
    for line in out.stdout.split("\n"):
        if line.strip():
            name, count = line.split()
            nodes[name.rstrip("*")] = nodes.get(name.rstrip("*"), 0) + int(count)
    default = next((ln.split()[0].rstrip("*") for ln in out.stdout.split("\n") if ln.split()[:1]
                    and ln.split()[0].endswith("*")), None)
    partition = site.partition or default
    if site.partition and site.partition not in nodes:
        raise GuideError(f"partition '{site.partition}' of site profile {site.file} is not a partition of this "
                         f"cluster ({', '.join(sorted(nodes)) or 'none'}); fix GUIDE_PARTITION")
    have = nodes.get(partition or "", 0)
    if partition and site.nodes_for(n) > have:
        raise GuideError(f"{n} engines at {site.tasks_per_node} per node (GUIDE_TASKS_PER_NODE) need "
                         f"{site.nodes_for(n)} nodes, but partition '{partition}' has {have}; "
                         f"ask for at most {have * site.tasks_per_node} engines")


def engines_batch_script(site: Site, n: int, *, walltime: str, log: str, controller: tuple[str, int],
                         watch: tuple[float, int] = (5.0, 3)) -> str:
    """The batch script that starts ``n`` ipyparallel engines, as a template for ipyparallel's
    Slurm launcher: ``{program_and_args}`` (the engine command) is the one field left."""
    host, port = controller
    lines = ["#!/bin/bash", "#SBATCH --job-name=ipengine-{cluster_id}",
             *(f"#SBATCH {o}" for o in site.sbatch_options(n)),
             f"#SBATCH --time={walltime}", f"#SBATCH --output={log}", "#SBATCH --export=ALL"]
    if site.srun_mpi != "none":  # one MPI world through Slurm's PMI plugin, as 03_multi_node_horovod
        kind, launch = "tasks", 'srun "${GUIDE_SRUN_TASKS[@]}"'  # with the site's srun options, as training
    else:  # the site's srun speaks no PMI that its MPI understands: mpirun inside the allocation
        kind, launch = "shell", ('mpirun -np "$SLURM_NTASKS" --map-by "ppr:$SLURM_NTASKS_PER_NODE:node" --bind-to none '
                                 '-x PATH "${GUIDE_EXEC[@]}"')
    body = f"""\
# ipyparallel engines for a notebook (guide_utils.cluster.interactive)
# site profile: {site.file}
set -euo pipefail
export GUIDE_ROOT={shlex.quote(str(repo_root()))} GUIDE_SITE={shlex.quote(site.file)}
# shellcheck source=/dev/null
source "$GUIDE_ROOT/slurm_examples/lib/guide.sh"
guide_load_site
guide_software
# The engines are one MPI world, like Horovod's ranks: the training's srun options for that.
# shellcheck disable=SC2034  # read by guide_task_options
GUIDE_DIST=horovod GUIDE_LAUNCH={kind}
guide_task_options
echo "== ipyparallel engines: job $SLURM_JOB_ID, $SLURM_NTASKS on $SLURM_JOB_NODELIST"
echo "== their controller: {host}:{port}"
# The engines live for the notebook: when its controller stops answering, give the nodes back.
"${{GUIDE_EXEC[@]}}" python -m guide_utils.cluster.watchdog controller {host} {port} {watch[0]:g} {watch[1]} &
{launch} """
    # ipyparallel formats the template: every other brace (bash's ${...}) must be doubled
    script = ("\n".join(lines) + "\n" + body).replace("{", "{{").replace("}", "}}")
    return script.replace("{{cluster_id}}", "{cluster_id}") + "{program_and_args}\n"
