"""``python -m guide_utils plan``: how many nodes, which per-worker batch, which learning rate,
before the allocation is spent.

Give the model (or its parameter count), what one GPU does alone (images/s at one or more
per-worker batches: measure it with chapter 1's baseline run), the network, the node shape,
the training (epochs x images) and a target:

* ``--min-efficiency F``: the fastest configuration whose predicted time-to-solution
  efficiency (one GPU's whole training over n times this one's) is at least F (the least
  wasteful fast run);
* ``--deadline-hours H``: the cheapest configuration (GPU-hours) that finishes within H;
* ``--budget-gpu-hours G``: the fastest configuration that costs at most G.

Targets combine (every one given must hold). ``--array N`` prints what N such runs cost
together (a job array of N tasks: seeds, a sweep) before it is submitted, and
``--whole-nodes`` bills every GPU of each node a task touches, as sites that allocate
whole nodes do. Each candidate's step is predicted by the step model of
:mod:`guide_utils.perf.model`, and its hours and GPU-hours by the time to solution of
:mod:`guide_utils.perf.solution`: the steps plus each epoch's slow first batch, validation
pass, checkpoint and boundary, and the job's start-up, with the terms calibrated on the
thesis's own trainings (:mod:`guide_utils.perf.thesis_runs`) unless ``--first-batch-s``,
``--epoch-overhead-s``, ``--validation-images`` or ``--startup-min`` say otherwise (the
step alone promised the thesis's 32-GPU run 5.0 h; it took 6.6 h). The answer comes with
the learning rate of the linear scaling rule for its global batch and the warmup the guide
recommends (gradual, 5 epochs, from one worker's rate: Goyal et al. 2017, the thesis's
experiments 8 and 9), and the submission command. Global batches beyond ``--max-global-batch`` (8192: the largest
Goyal et al. trained ResNet-50 at without losing accuracy) are not proposed.

    python -m guide_utils plan --model resnet50 --throughput 128:207.79 --network 56Gbit/s \\
        --gpus-per-node 4 --max-nodes 8 --min-efficiency 0.9
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from ..core.cli import ArgumentParser, one_line_errors
from ..core.errors import GuideError
from ..core.scaling import IMAGENET_TRAIN_IMAGES, scaled_lr
from .model import PARAMETERS, Network, Prediction, Workload, predict
from .solution import Overheads, time_to_solution

PROG = "python -m guide_utils plan"
GOYAL_MAX_BATCH = 8192
WARMUP_EPOCHS = 5


@dataclass(frozen=True)
class Target:
    min_efficiency: float | None = None
    deadline_hours: float | None = None
    budget_gpu_hours: float | None = None

    def __post_init__(self):
        if self.min_efficiency is not None and not 0 < self.min_efficiency <= 1:
            raise GuideError(f"--min-efficiency is a fraction in (0, 1], e.g. 0.8, got {self.min_efficiency}")
        for name, v in (("--deadline-hours", self.deadline_hours), ("--budget-gpu-hours", self.budget_gpu_hours)):
            if v is not None and not v > 0:
                raise GuideError(f"{name} must be positive, got {v}")
        if self.min_efficiency is None and self.deadline_hours is None and self.budget_gpu_hours is None:
            raise GuideError("give a target: --min-efficiency F, --deadline-hours H or --budget-gpu-hours G")


def schedule_for(global_batch: int, per_worker_batch: int, *, base_lr: float = 0.1,
                 base_batch: int = 256) -> dict[str, Any]:
    """The learning rate and warmup the guide recommends for ``global_batch``: the linear
    scaling rule, and above the base batch a 5-epoch gradual warmup from one worker's rate.

    >>> schedule_for(4096, 128)
    {'lr': 1.6, 'lr_scaling': 'linear', 'warmup': 'gradual', 'warmup_epochs': 5, 'warmup_start_lr': 0.05}
    """
    lr = scaled_lr(base_lr, base_batch, global_batch)
    if global_batch <= base_batch:
        return {"lr": lr, "lr_scaling": "linear", "warmup": "none", "warmup_epochs": 0, "warmup_start_lr": None}
    return {"lr": lr, "lr_scaling": "linear", "warmup": "gradual", "warmup_epochs": WARMUP_EPOCHS,
            "warmup_start_lr": scaled_lr(base_lr, base_batch, per_worker_batch)}


def worker_counts(gpus_per_node: int, max_nodes: int) -> list[tuple[int, int]]:
    """``(nodes, workers)`` to consider: 1, 2, 4 ... GPUs of one node, then whole nodes.

    >>> worker_counts(4, 3)
    [(1, 1), (1, 2), (1, 4), (2, 8), (3, 12)]
    """
    if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise GuideError(f"--gpus-per-node must be a positive integer, got {gpus_per_node!r}")
    if not isinstance(max_nodes, int) or max_nodes < 1:
        raise GuideError(f"--max-nodes must be a positive integer, got {max_nodes!r}")
    one_node, g = [], 1
    while g < gpus_per_node:
        one_node.append((1, g))
        g *= 2
    return one_node + [(n, n * gpus_per_node) for n in range(1, max_nodes + 1)]


def candidates(throughputs: dict[int, float], params: int, network: Network, *, gpus_per_node: int,
               max_nodes: int, epochs: int, images: int, node_network: Network | None = None,
               bytes_per_element: int = 4, overlap: float = 0.0, max_global_batch: int = GOYAL_MAX_BATCH,
               nodes_only: int | None = None, overheads: Overheads | None = None):
    """Every (per-worker batch, node count) predicted, as a DataFrame, one row each: the step
    (``efficiency`` is its throughput efficiency), the time to solution term by term
    (``wall_hours``, ``gpu_hours``) and ``tts_efficiency``, one GPU's wall time at the same
    batch over ``workers`` x this one's. ``overheads``: the thesis's calibration when None;
    ``nodes_only``: just that many whole nodes."""
    import pandas as pd

    if not throughputs:
        raise GuideError("give at least one --throughput BATCH:IMAGES_PER_S (one GPU alone at that batch)")
    overheads = default_overheads() if overheads is None else overheads
    counts = worker_counts(gpus_per_node, max_nodes)
    if nodes_only is not None:
        counts = [(n, w) for n, w in worker_counts(gpus_per_node, nodes_only)
                  if n == nodes_only and w == n * gpus_per_node]
        _usable(nodes_only * gpus_per_node, min(throughputs), max_global_batch, images)
    rows = []
    for batch, rate in sorted(throughputs.items()):
        work = Workload(params, batch, rate, bytes_per_element=bytes_per_element, overlap=overlap)
        alone = time_to_solution(predict(work, network, 1), overheads, epochs=epochs, images=images,
                                 params=params)["wall_hours"]
        for nodes, workers in counts:
            if workers * batch > max_global_batch or workers * batch > images:
                continue
            net = node_network if (node_network is not None and nodes == 1) else network
            p: Prediction = predict(work, net, workers)
            t = time_to_solution(p, overheads, epochs=epochs, images=images, params=params)
            rows.append({"nodes": nodes, **p.as_dict(), **t, "tts_efficiency": alone / t["gpu_hours"]})
    if not rows:
        smallest = min(throughputs)
        raise GuideError(f"no configuration fits: even one worker's batch {smallest} x {gpus_per_node} GPUs per node "
                         f"exceeds --max-global-batch {max_global_batch} or the {images} images per epoch; use "
                         "smaller per-worker batches or fewer GPUs per node")
    return pd.DataFrame(rows)


def default_overheads(**given) -> Overheads:
    """The time-to-solution terms calibrated on the thesis's Horovod runs (its 32-GPU first
    batch, the fitted epoch term), each replaced by the value ``given`` where not None."""
    from .thesis_runs import thesis_overheads

    base = thesis_overheads()
    fields = {k: v for k, v in given.items() if v is not None}
    return Overheads(**{**{"first_batch_s": base.first_batch_s, "epoch_s": base.epoch_s,
                           "validation_images": base.validation_images}, **fields})


def _usable(workers: int, batch: int, max_global_batch: int, images: int) -> None:
    """One line when ``workers`` are more than the training can use at any offered batch."""
    if workers * batch > max_global_batch:
        raise GuideError(f"{workers} GPUs x per-worker batch {batch} = global batch {workers * batch}, above "
                         f"--max-global-batch {max_global_batch} (beyond it linear scaling + warmup lose accuracy, "
                         "Goyal et al. 2017): more workers than this training can use; use fewer nodes, a smaller "
                         "per-worker batch, or LARS/LAMB (--optimizer lars) and raise --max-global-batch")
    if workers * batch > images:
        raise GuideError(f"{workers} GPUs x per-worker batch {batch} is more than the {images} images of an epoch")


def choose(table, target: Target) -> dict[str, Any]:
    """The configuration ``target`` asks for (see the module doc), or a GuideError that says
    how close the best candidate came."""
    ok = table
    if target.min_efficiency is not None:
        ok = ok[ok["tts_efficiency"] >= target.min_efficiency - 1e-12]
    if target.deadline_hours is not None:
        ok = ok[ok["wall_hours"] <= target.deadline_hours]
    if target.budget_gpu_hours is not None:
        ok = ok[ok["gpu_hours"] <= target.budget_gpu_hours]
    if ok.empty:
        raise GuideError(_miss(table, target))
    if target.deadline_hours is not None:  # cheapest that is in time, then the faster
        best = ok.sort_values(["gpu_hours", "wall_hours"]).iloc[0]
    else:  # fastest within the floor and the budget, then the cheaper
        best = ok.sort_values(["wall_hours", "gpu_hours"]).iloc[0]
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in best.items()}


def _miss(table, target: Target) -> str:
    fastest = table.sort_values("wall_hours").iloc[0]
    cheapest = table.sort_values("gpu_hours").iloc[0]
    parts = []
    if target.min_efficiency is not None:
        parts.append(f"time-to-solution efficiency >= {target.min_efficiency:g} (best beyond one GPU: "
                     f"{_best_multi(table):.2f})")
    if target.deadline_hours is not None:
        parts.append(f"{target.deadline_hours:g} h (fastest: {fastest.wall_hours:.1f} h on "
                     f"{int(fastest.workers)} GPUs)")
    if target.budget_gpu_hours is not None:
        parts.append(f"{target.budget_gpu_hours:g} GPU-hours (cheapest: {cheapest.gpu_hours:.0f} on "
                     f"{int(cheapest.workers)} GPU(s))")
    return "no configuration meets " + " and ".join(parts) + "; relax a target, raise --max-nodes or the network"


def _best_multi(table) -> float:
    multi = table[table["workers"] > 1]
    return float((multi if not multi.empty else table)["tts_efficiency"].max())


def plan(*, params: int, throughputs: dict[int, float], network: Network, target: Target, gpus_per_node: int,
         max_nodes: int, epochs: int = 90, images: int = IMAGENET_TRAIN_IMAGES, node_network: Network | None = None,
         fp16_allreduce: bool = False, overlap: float = 0.0, max_global_batch: int = GOYAL_MAX_BATCH,
         base_lr: float = 0.1, base_batch: int = 256, nodes: int | None = None, array: int = 1,
         whole_nodes: bool = False, overheads: Overheads | None = None) -> dict[str, Any]:
    """The whole answer: the chosen configuration, its schedule and command, what ``array``
    runs of it cost (:func:`array_cost`), all candidates. The targets are for one run, its
    hours and GPU-hours its time to solution (``overheads``: the thesis's when None)."""
    table = candidates(throughputs, params, network, gpus_per_node=gpus_per_node, max_nodes=max_nodes,
                       epochs=epochs, images=images, node_network=node_network,
                       bytes_per_element=2 if fp16_allreduce else 4, overlap=overlap,
                       max_global_batch=max_global_batch, nodes_only=nodes, overheads=overheads)
    choice = choose(table, target)
    sched = schedule_for(int(choice["global_batch"]), int(choice["per_worker_batch"]), base_lr=base_lr,
                         base_batch=base_batch)
    note = ""
    if int(choice["workers"]) == 1 and (table["workers"] > 1).any():
        note = (f"no configuration with more GPUs meets the target (best time-to-solution efficiency beyond one "
                f"GPU: {_best_multi(table):.2f}): stay on one GPU, or raise the network or the per-worker batch")
    return {"choice": choice, "schedule": sched, "note": note,
            "command": command(choice, sched, gpus_per_node, fp16_allreduce),
            "cost": array_cost(choice, tasks=array, gpus_per_node=gpus_per_node, whole_nodes=whole_nodes),
            "candidates": table.to_dict("records")}


def array_cost(choice: dict[str, Any], *, tasks: int = 1, gpus_per_node: int, whole_nodes: bool = False
               ) -> dict[str, Any]:
    """What ``tasks`` runs of ``choice`` cost together (a job array), in GPU-hours: each task
    its GPUs for its wall-clock time, or, ``whole_nodes``, every GPU of each node it holds.

    >>> array_cost({"workers": 1, "nodes": 1, "wall_hours": 10.0}, tasks=8, gpus_per_node=4, whole_nodes=True)
    {'tasks': 8, 'billed_gpus': 4, 'gpu_hours_per_task': 40.0, 'gpu_hours': 320.0, 'whole_nodes': True}
    """
    if not isinstance(tasks, int) or tasks < 1:
        raise GuideError(f"--array must be a positive integer (the array's tasks), got {tasks}")
    billed = int(choice["nodes"]) * gpus_per_node if whole_nodes else int(choice["workers"])
    per_task = float(choice["wall_hours"]) * billed
    return {"tasks": tasks, "billed_gpus": billed, "gpu_hours_per_task": per_task, "gpu_hours": per_task * tasks,
            "whole_nodes": whole_nodes}


def command(choice: dict[str, Any], sched: dict[str, Any], gpus_per_node: int, fp16_allreduce: bool) -> str:
    """The submission that runs ``choice`` with the guide's sbatch examples."""
    flags = f"--per-worker-batch {int(choice['per_worker_batch'])}"
    if sched["warmup"] != "none":
        flags += f" --warmup {sched['warmup']} --warmup-epochs {sched['warmup_epochs']}"
    flags += " --fp16-allreduce" if fp16_allreduce else ""
    nodes, workers = int(choice["nodes"]), int(choice["workers"])
    if workers == 1:
        return f"slurm_examples/submit.sh slurm_examples/01_single_gpu_baseline.sbatch -- {flags}"
    if nodes == 1:
        return (f"slurm_examples/submit.sh slurm_examples/02_single_node_data_parallel.sbatch "
                f"--ntasks-per-node={workers} -- {flags}")
    return f"slurm_examples/submit.sh slurm_examples/03_multi_node_horovod.sbatch --nodes={nodes} -- {flags}"


def parse_throughputs(items: list[str]) -> dict[int, float]:
    """``["128:207.79", "32:180"]`` -> ``{128: 207.79, 32: 180.0}``."""
    out = {}
    for item in items:
        batch, sep, rate = item.partition(":")
        try:
            b, r = int(batch), float(rate)
        except ValueError:
            b, r = 0, 0.0
        if not sep or b <= 0 or not r > 0:
            raise GuideError(f"--throughput {item!r}: write PER_WORKER_BATCH:IMAGES_PER_SECOND of one GPU alone, "
                             "both positive, e.g. 128:207.79")
        out[b] = r
    return out


def build_parser() -> ArgumentParser:
    import argparse

    p = ArgumentParser(prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=__doc__.split("\n\n", 1)[1])
    g = p.add_argument_group("the training")
    g.add_argument("--model", default="resnet50", help=f"one of {', '.join(PARAMETERS)} (default resnet50), "
                                                       "or give --params")
    g.add_argument("--params", type=int, help="the model's parameter count (instead of --model)")
    g.add_argument("--throughput", nargs="+", required=True, metavar="BATCH:IMG/S",
                   help="one GPU alone: images/s at that per-worker batch (several batches allowed)")
    g.add_argument("--epochs", type=int, default=90, help="(default 90)")
    g.add_argument("--images", type=int, default=IMAGENET_TRAIN_IMAGES, help="per epoch (default: ImageNet's 1281167)")
    g.add_argument("--base-lr", type=float, default=0.1, help="learning rate tuned at --base-batch (default 0.1)")
    g.add_argument("--base-batch", type=int, default=256, help="(default 256)")
    g.add_argument("--max-global-batch", type=int, default=GOYAL_MAX_BATCH,
                   help="largest global batch to propose (default 8192, Goyal et al. 2017)")
    g = p.add_argument_group("the machine")
    g.add_argument("--network", required=True, help="bandwidth per node for the allreduce, with units: 100Gbit/s, "
                                                    "25GbE, 12GB/s (nccl-tests' busbw between nodes)")
    g.add_argument("--latency", default="5us", help="per ring step (default 5us, InfiniBand; TCP: 30us or more)")
    g.add_argument("--node-network", help="bandwidth inside one node (NVLink, PCIe), if it differs")
    g.add_argument("--gpus-per-node", type=int, default=4, help="(default 4)")
    g.add_argument("--max-nodes", type=int, default=32, help="largest allocation to consider (default 32)")
    g.add_argument("--nodes", type=int, help="only this many whole nodes (then the answer picks the batch)")
    g.add_argument("--fp16-allreduce", action="store_true", help="gradients sent as fp16 (half the bytes)")
    g.add_argument("--overlap", type=float, default=0.0,
                   help="share of the backward pass communication can hide under, 0 to 1 (default 0: none)")
    g = p.add_argument_group("the time to solution (default: calibrated on the thesis's runs)")
    g.add_argument("--first-batch-s", type=float, help="seconds the first batch of each epoch takes (thesis: 9.95)")
    g.add_argument("--epoch-overhead-s", type=float,
                   help="seconds each epoch costs besides its steps, validation and checkpoint (thesis: fitted)")
    g.add_argument("--validation-images", type=int, help="validated after each epoch (default 50000; 0: none)")
    g.add_argument("--startup-min", type=float, default=0.0,
                   help="minutes before the first step: staging data, imports (default 0: in the epoch term)")
    g = p.add_argument_group("the target (at least one; all given must hold)")
    g.add_argument("--min-efficiency", type=float,
                   help="time-to-solution efficiency floor (one GPU's hours / (n x these)), e.g. 0.8")
    g.add_argument("--deadline-hours", type=float, help="wall-clock hours the training must fit in")
    g.add_argument("--budget-gpu-hours", type=float, help="GPU-hours the training may cost")
    g = p.add_argument_group("the cost")
    g.add_argument("--array", type=int, default=1, metavar="N",
                   help="the GPU-hours of N such runs, a job array of N tasks (default 1)")
    g.add_argument("--whole-nodes", action="store_true",
                   help="the site bills whole nodes: every GPU of a node a task holds counts")
    p.add_argument("--json", action="store_true", help="the answer as one JSON object")
    return p


def format_answer(answer: dict[str, Any]) -> str:
    c, s = answer["choice"], answer["schedule"]
    warm = "no warmup" if s["warmup"] == "none" else \
        f"{s['warmup']} warmup over {s['warmup_epochs']} epochs from lr {s['warmup_start_lr']:g}"
    lines = [f"{int(c['nodes'])} node(s), {int(c['workers'])} GPU(s) x {int(c['per_worker_batch'])} = global batch "
             f"{int(c['global_batch'])}",
             f"predicted: step {c['step_s'] * 1e3:.0f} ms (compute {c['compute_s'] * 1e3:.0f} ms, allreduce "
             f"{c['allreduce_s'] * 1e3:.1f} ms, exposed {c['exposed_s'] * 1e3:.1f} ms), {c['images_per_second']:.0f} "
             f"img/s, throughput efficiency {c['efficiency']:.2f}",
             f"training: {c['wall_hours']:.1f} h wall clock, {c['gpu_hours']:.0f} GPU-hours, time-to-solution "
             f"efficiency {c['tts_efficiency']:.2f}",
             f"  = steps {c['steps_hours']:.1f} h, first batches {c['first_batch_hours']:.1f}, validation "
             f"{c['validation_hours']:.1f}, checkpoints {c['checkpoint_hours']:.1f}, epoch ends "
             f"{c['epoch_hours']:.1f}, start-up {c['startup_hours']:.1f}",
             f"learning rate {s['lr']:g} ({s['lr_scaling']} scaling rule), {warm}",
             f"submit: {answer['command']}"]
    cost = answer.get("cost")
    if cost and (cost["tasks"] > 1 or cost["whole_nodes"]):
        billed = f"{cost['billed_gpus']} GPU(s) billed per task" + (", whole nodes" if cost["whole_nodes"] else "")
        lines.append(f"cost: {cost['tasks']} task(s) x {cost['gpu_hours_per_task']:.0f} GPU-hours = "
                     f"{cost['gpu_hours']:.0f} GPU-hours ({billed})")
    if answer.get("note"):
        lines.append(f"note: {answer['note']}")
    return "\n".join(lines)


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    from .model import parse_latency

    args = build_parser().parse_args(argv)
    if args.params is None and args.model not in PARAMETERS:
        raise GuideError(f"unknown --model {args.model!r}; choose from {', '.join(PARAMETERS)} or give --params N")
    if args.epochs <= 0 or args.images <= 0 or args.max_global_batch <= 0 or args.base_batch <= 0 or args.base_lr <= 0:
        raise GuideError("--epochs, --images, --max-global-batch, --base-batch and --base-lr must be positive")
    if args.nodes is not None and args.nodes < 1:
        raise GuideError(f"--nodes must be a positive integer, got {args.nodes}")
    if not 0 <= args.overlap <= 1:
        raise GuideError(f"--overlap is a fraction from 0 to 1, got {args.overlap}")
    if args.startup_min < 0 or (args.validation_images is not None and args.validation_images < 0):
        raise GuideError("--startup-min and --validation-images must not be negative")
    latency = parse_latency(args.latency)
    overheads = default_overheads(first_batch_s=args.first_batch_s, epoch_s=args.epoch_overhead_s,
                                  validation_images=args.validation_images, startup_s=60 * args.startup_min)
    answer = plan(params=args.params if args.params is not None else PARAMETERS[args.model],
                  throughputs=parse_throughputs(args.throughput), network=Network.of(args.network, latency),
                  node_network=Network.of(args.node_network, latency) if args.node_network else None,
                  target=Target(args.min_efficiency, args.deadline_hours, args.budget_gpu_hours),
                  gpus_per_node=args.gpus_per_node, max_nodes=args.max_nodes, epochs=args.epochs, images=args.images,
                  fp16_allreduce=args.fp16_allreduce, overlap=args.overlap, max_global_batch=args.max_global_batch,
                  base_lr=args.base_lr, base_batch=args.base_batch, nodes=args.nodes, array=args.array,
                  whole_nodes=args.whole_nodes, overheads=overheads)
    print(json.dumps(answer) if args.json else format_answer(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
