"""The doctor per task: the CPUs and GPUs each training process of a Slurm job really gets.

The batch shell sees the whole allocation; what a task gets is decided when srun starts it,
and that is where jobs go wrong without a word:

* srun of Slurm 22.05-23.02 does not take ``--cpus-per-task`` from the job: where tasks are
  bound to cores (``--cpu-bind=cores``, ``--exact``, many sites' defaults) each one gets ONE
  CPU, for itself and its data loaders, while ``SLURM_CPUS_PER_TASK`` still says N;
* a step started without the job's GPUs (its device list is empty) trains on the CPU;
* two ranks of a node on one GPU (fewer GPUs listed than tasks) are slow or run out of memory.

So every task prints what it sees (``python -m guide_utils task-probe``, one JSON line, no
torch: :func:`probe`), a launcher that starts N processes itself is probed as N
(``task-probe --local N``: :func:`local_probes`), and ``python -m guide_utils doctor
--tasks FILE`` judges them together (:func:`diagnose`, :func:`render`): exit status 0 when
each task gets what the job asked for, 1 when not (a PROBLEM line says what and the fix),
2 for input that is not probes.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, Mapping

from ...core.cli import ArgumentParser, one_line_errors
from ...core.errors import GuideError
from ...runtime import launchers
from ...runtime.cpus import affinity
from ...runtime.gpus import allocated, device_index, device_variable, usable_devices, visible_devices
from ...runtime.slurm import SlurmJob, read_int

PROG = "python -m guide_utils task-probe"
NONE = type(None)
# A probe's fields and their JSON types: what doctor --tasks accepts.
FIELDS: dict[str, tuple[type, ...]] = {
    "node": (str,), "rank": (int,), "local_rank": (int,), "cpus": (list,), "cpus_per_task": (int, float, NONE),
    "gpu_variable": (str, NONE), "visible_gpus": (list, NONE), "gpu": (str, NONE), "job_gpus": (str, NONE),
    "local": (bool,),
}
CPU_FIX = ("srun did not pass --cpus-per-task on to the step (Slurm 22.05-23.02) and binds each task to its "
           "share; export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK before srun (slurm_examples/lib/guide.sh does), "
           "or give srun --cpus-per-task")
GPU_FIX = ("give each task its own GPU: as many GPUs per node as tasks (GUIDE_GPU_REQUEST, e.g. --gres=gpu:N), "
           "--gpus-per-task=1, or srun --gpu-bind=single:1; or run fewer tasks per node")


def _cpus() -> list[int]:
    return affinity()


def probe(env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """What this process sees: its node, rank and local rank, the CPUs it may run on, the
    CPUs per task the job asked for, its GPUs and the one the engine would take."""
    # The launcher's ranks (runtime.launchers): under torchrun or mpirun in an srun step,
    # SLURM_PROCID is the node's task or its daemon's, not the rank.
    launcher = launchers.detect(env)
    local_rank = launcher.local_rank if launcher is not None else 0
    usable = usable_devices(env)
    return {
        "node": env.get("SLURMD_NODENAME") or socket.gethostname(),
        "rank": launcher.rank if launcher is not None else 0,
        "local_rank": local_rank,
        "cpus": _cpus(),
        "cpus_per_task": read_int(env, "SLURM_CPUS_PER_TASK"),
        "gpu_variable": device_variable(env),
        "visible_gpus": visible_devices(env),
        "gpu": usable[device_index(local_rank, len(usable))] if usable else None,
        "job_gpus": allocated(env),  # NAME=value that shows the job has GPUs, None on a CPU job
        "local": False,
    }


def local_probes(n: int, env: Mapping[str, str] = os.environ) -> list[dict[str, Any]]:
    """Probes for the ``n`` processes a launcher (horovodrun, torchrun) starts from this shell
    or task: local ranks 0..n-1, with this process's CPUs and GPUs, each asking for its share
    of the CPUs the launcher was given."""
    if n < 1:
        raise GuideError(f"--local {n}: give the number of processes the launcher starts here (1 or more)")
    first = read_int(env, "SLURM_PROCID") or 0  # a launcher per node: its task id is the node's index
    base = {k: v for k, v in env.items() if k not in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_LOCALID")}
    job = SlurmJob.from_env(env)
    # what torchrun would tell each of them (runtime.launchers reads it as torchrun's)
    world = str(n * (max(job.num_nodes, 1) if job is not None else 1))
    probes = [probe({**base, "RANK": str(first * n + i), "LOCAL_RANK": str(i), "WORLD_SIZE": world,
                     "LOCAL_WORLD_SIZE": str(n)}) for i in range(n)]
    asked = _asked_per_process(job, n)
    for p in probes:
        p.update(cpus_per_task=asked, local=True)
    return probes


def _asked_per_process(job: SlurmJob | None, n: int) -> int | float | None:
    if job is None or job.cpus_per_task is None:
        return None
    # The launcher holds the CPUs of the Slurm tasks it stands for: its own task's when srun
    # started it (one launcher per node), the node's tasks' when it runs in the batch shell.
    node, tasks = job.nodeid or 0, 1
    if not job.in_step:
        tasks = job.tasks_per_node[node] if node < len(job.tasks_per_node) else n
    share = job.cpus_per_task * tasks / n
    return int(share) if share.is_integer() else round(share, 2)


def _by_node(probes: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    nodes: dict[str, list[dict[str, Any]]] = {}
    for p in sorted(probes, key=lambda p: p["rank"]):
        nodes.setdefault(p["node"], []).append(p)
    return nodes


def _share(tasks: list[dict[str, Any]]) -> float:
    """CPUs per task on a node: every CPU its tasks may use, over the tasks."""
    return len(set().union(*(t["cpus"] for t in tasks))) / len(tasks)


def _asked(tasks: list[dict[str, Any]]) -> float | None:
    return max((t["cpus_per_task"] for t in tasks if t["cpus_per_task"] is not None), default=None)


def _ranks(tasks: list[dict[str, Any]]) -> str:
    return ",".join(str(t["rank"]) for t in tasks)


def _cpu_problems(node: str, tasks: list[dict[str, Any]]) -> list[str]:
    asked, each = _asked(tasks), _share(tasks)
    if asked is None or each >= asked:
        return []
    if any(t["local"] for t in tasks):  # the launcher's own CPUs, split among its processes
        return [f"the {len(tasks)} processes a launcher starts on {node} would have {each:.3g} CPU(s) each, the "
                f"job asked for {asked:g} per process: give the launcher's task the CPUs of all of them "
                f"(srun --cpus-per-task={round(asked * len(tasks))} for a launcher per node) or start fewer"]
    return [f"the {len(tasks)} task(s) on {node} (ranks {_ranks(tasks)}) may use {each:.3g} CPU(s) each, the job "
            f"asked for {asked:g} per task: {CPU_FIX}"]


def _blind(task: dict[str, Any]) -> bool:
    """Whether a task of a GPU job gets no GPU: its device list is empty, or it has no list and
    no count of the step's GPUs on its node (a step started with --gres=none: where the site
    confines devices, no GPU) although Slurm knows the job's GPUs by index. A step given GPUs
    per task without binding (--gpu-bind=none) has no list either, but has its count."""
    indexed = (task["job_gpus"] or "").startswith(("SLURM_JOB_GPUS=", "SLURM_STEP_GPUS="))
    unlisted = task["visible_gpus"] is None and task["gpu"] is None
    return task["visible_gpus"] == [] or (unlisted and indexed)


def _gpu_problems(node: str, tasks: list[dict[str, Any]]) -> list[str]:
    if not any(t["job_gpus"] for t in tasks):
        return []  # a CPU job (or a CPU site): no GPU to miss or share
    problems = []
    blind = [t for t in tasks if _blind(t)]
    if blind:
        evidence = next(t["job_gpus"] for t in tasks if t["job_gpus"])
        variable = blind[0]["gpu_variable"]
        seen = f"{variable} is empty" if variable else "no device list, no SLURM_GPUS_ON_NODE"
        problems.append(f"rank(s) {_ranks(blind)} on {node} see no GPU ({seen}) although the job has GPUs "
                        f"({evidence}), so they would train on the CPU: start the step with the job's GPUs (no "
                        f"--gpus=0 or --gres=none on srun; e.g. srun --gpus-per-task=1)")
    users: dict[str, list[dict[str, Any]]] = {}
    for t in tasks:
        if t["gpu"] is not None:
            users.setdefault(t["gpu"], []).append(t)
    shared = {gpu: ts for gpu, ts in users.items() if len(ts) > 1}
    if shared:
        lists = sorted({f"{t['gpu_variable']}={','.join(t['visible_gpus'])}" if t["visible_gpus"] is not None
                        else "no device list" for ts in shared.values() for t in ts})
        which = "; ".join(f"ranks {_ranks(ts)} on GPU {gpu}" for gpu, ts in shared.items())
        problems.append(f"ranks on {node} would share a GPU ({which}; {len(tasks)} tasks, {' / '.join(lists)}): "
                        f"{GPU_FIX}")
    return problems


def diagnose(probes: list[dict[str, Any]]) -> list[str]:
    """Problems, one line each with its fix: tasks with fewer CPUs than the job asked for,
    tasks of a GPU job without a GPU, ranks of one node on one GPU."""
    problems = []
    for node, tasks in _by_node(probes).items():
        problems += _cpu_problems(node, tasks) + _gpu_problems(node, tasks)
    return problems


def _gpu_column(tasks: list[dict[str, Any]]) -> str:
    if not any(t["job_gpus"] or t["visible_gpus"] for t in tasks):
        return "none"
    # "-": no GPU; "?": no device list, the task sees every GPU of the node.
    cells = [f"{t['rank']}:{t['gpu'] or ('-' if _blind(t) or t['visible_gpus'] == [] else '?')}" for t in tasks]
    return " ".join(cells) + (" (?: no device list, every GPU of the node)" if any("?" in c for c in cells) else "")


def render(probes: list[dict[str, Any]], problems: list[str]) -> str:
    """One line per node (tasks, CPUs per task, rank:GPU), the PROBLEM lines, the verdict."""
    nodes = _by_node(probes)
    rows = []
    for node, tasks in nodes.items():
        asked = _asked(tasks)
        cpus = f"{_share(tasks):.3g} CPU(s) each" + (f" (asked {asked:g})" if asked is not None else "")
        rows.append((node, f"{len(tasks)} task(s), {cpus}; GPU by rank: {_gpu_column(tasks)}"))
    width = max(len(name) for name, _ in rows)
    lines = [f"{name.ljust(width)}  {value}" for name, value in rows]
    lines += [f"PROBLEM: {p}" for p in problems]
    lines.append(f"tasks usable: {'NO' if problems else 'yes'} ({len(probes)} task(s) on {len(nodes)} node(s))")
    return "\n".join(lines)


def _invalid(item: Any) -> str | None:
    """What keeps ``item`` from being a probe; None if nothing does."""
    if not isinstance(item, dict):
        return "not a JSON object"
    for name, types in FIELDS.items():
        if name not in item:
            return f"no {name!r}"
        if not isinstance(item[name], types) or (name in ("rank", "local_rank") and isinstance(item[name], bool)):
            return f"{name!r} is {item[name]!r}"
    if not item["cpus"] or not all(isinstance(c, int) for c in item["cpus"]):
        return f"'cpus' is {item['cpus']!r}, not a list of CPU numbers"
    return None


def read_probes(text: str, source: str) -> list[dict[str, Any]]:
    """The probes in ``text``, one JSON line each (blank lines are skipped)."""
    probes = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            item = None
        problem = _invalid(item)
        if problem:
            raise GuideError(f"line {number} of {source} is not a task probe ({problem}): {line[:60]!r}; give it "
                             f"only the lines of `srun ... {PROG}` (or {PROG} --local N)")
        probes.append(item)
    if not probes:
        raise GuideError(f"{source} holds no task probes; pass the output of `srun ... {PROG}` (or {PROG} --local N)")
    return probes


def check(path: str) -> int:
    """``doctor --tasks PATH`` (- for stdin): print the report; 1 when there is a PROBLEM."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    probes = read_probes(text, "stdin" if path == "-" else path)
    problems = diagnose(probes)
    print(render(probes, problems))
    return 1 if problems else 0


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog=PROG,
                            description="Print what this task sees (node, rank, CPUs, GPUs) as one JSON line, "
                                        "for `python -m guide_utils doctor --tasks`. Run it in every task: "
                                        f"srun ... {PROG} | python -m guide_utils doctor --tasks -")
    parser.add_argument("--local", type=int, metavar="N",
                        help="print N lines, for the N processes a launcher (horovodrun, torchrun) starts here")
    args = parser.parse_args(argv)
    for p in local_probes(args.local) if args.local is not None else [probe()]:
        print(json.dumps(p), flush=True)
    return 0
