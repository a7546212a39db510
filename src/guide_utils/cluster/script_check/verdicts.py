"""The checks on one unbroken run: what the ranks recorded (``probe``), compared rank with
rank. Each check returns a :class:`Verdict`: PASS, FAIL or SKIP, its name, and the evidence;
a FAIL names the likely cause and the chapter's fix.

>>> Verdict("FAIL", "data", "the same samples").line()
'FAIL  data        the same samples'
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .runs import Run

CHAPTER = "chapter 16"
# Optimizers that rescale each step by running averages of the gradients: the linear rule's
# argument does not carry over, and the chapter starts them from the square-root rule.
ADAPTIVE = ("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adadelta", "Adagrad", "RMSprop", "LAMB", "Lamb")
# The script's own flags that hold the one-GPU learning rate and the warmup, as ports name them.
LR_FLAGS = ("lr", "learning_rate", "base_lr")
WARMUP_FLAGS = ("warmup_epochs", "lr_warmup_epochs", "warmup")
# Known errors and the fix each needs: (a pattern of the error, the cause and fix).
KNOWN = (
    (r"sampler option is mutually exclusive with shuffle",
     "DataLoader refuses a sampler beside shuffle=True: drop the shuffle (the sampler shuffles), also where "
     f"a settings dict adds it ({CHAPTER}, item 4)"),
    (r"(Missing|Unexpected) key\(s\) in state_dict.*\"?module\.",
     "the checkpoint holds the DDP wrapper's keys ('module.') and the restart loads them into the bare model: "
     f"save model.module.state_dict(), the unwrapped model's ({CHAPTER}, item 10)"),
    (r"Gradients were computed more than backward_passes_per_step",
     "two backward passes before one step: give hvd.DistributedOptimizer backward_passes_per_step "
     f"({CHAPTER}, \"Shapes the examples do not have\")"),
    (r"Connection closed by peer|Connection reset by peer|connectFullMesh|Timed out waiting|"
     r"Horovod has been shut down|ranks? .* (exited|terminated)",
     "a rank waited in a collective that another rank had left: the ranks took different paths through "
     f"the loop (a break under `if rank == 0`, shards of unequal length) ({CHAPTER}, item 8)"),
)
CUDA_ERRORS = (r"Torch not compiled with CUDA enabled|Found no NVIDIA driver|No CUDA GPUs are available|"
               r"ProcessGroupNCCL is only supported with GPUs|NCCL.*(no GPUs|GPU.*not available)|"
               r"CUDA driver initialization failed|no accelerator|Invalid device id|cudaGetDeviceCount")
DEVICE_FIX = ('device = torch.device("cuda" if torch.cuda.is_available() else "cpu"), and the backend with it, '
              '"nccl" if device.type == "cuda" else "gloo"')


@dataclass(frozen=True)
class Verdict:
    status: str  # PASS, FAIL or SKIP
    name: str
    evidence: str

    def line(self) -> str:
        return f"{self.status:<4}  {self.name:<10}  {self.evidence}"


def explain(text: str) -> str | None:
    """The cause and fix of a known error in ``text``, or None."""
    return next((fix for pattern, fix in KNOWN if re.search(pattern, text, re.S)), None)


def asks_for_cuda(text: str) -> bool:
    return re.search(CUDA_ERRORS, text) is not None


def ranks_list(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def max_difference(a, b) -> float | None:
    """The largest difference between two ranks' saved weights (lists of {name: tensor})."""
    if not a or not b:
        return None
    diffs = [(x[k].double() - y[k].double()).abs().max().item() for x, y in zip(a, b) for k in x
             if k in y and x[k].shape == y[k].shape and x[k].is_floating_point() and x[k].numel()]
    return max(diffs, default=None)


def fwds(run: Run) -> dict[int, list[dict]]:
    return {r: rank.of("fwd") for r, rank in run.ranks.items()}


def _used(run: Run, kind: str) -> bool:
    return any(rank.of(kind) for rank in run.ranks.values())


# -- the checks --------------------------------------------------------------------------------

def broadcast(run: Run) -> Verdict:
    firsts = {r: f[0] for r, f in fwds(run).items() if f}
    begins = {r: rank.of("begin")[0] for r, rank in run.ranks.items() if rank.of("begin")}
    if len(firsts) < len(run.ranks):
        return Verdict("SKIP", "broadcast", f"{ranks_list(set(run.ranks) - set(firsts))} never trained")
    if len({f["w"] for f in firsts.values()}) > 1:
        gap = max_difference(run.weights(0, "first"), run.weights(min(set(firsts) - {0}), "first"))
        return Verdict("FAIL", "broadcast", "the ranks start from different weights"
                       + (f" (largest difference {gap:.3g} at the first training pass)" if gap is not None else "")
                       + ": broadcast rank 0's before the first step, "
                       "hvd.broadcast_parameters(model.state_dict(), root_rank=0), or wrap the model in "
                       f"DistributedDataParallel, which does ({CHAPTER}, item 3)")
    lone = sorted(r for r, b in begins.items() if not b["broadcasts"])
    if lone:
        return Verdict("FAIL", "broadcast", f"the ranks start from equal weights only because they draw alike: "
                       f"nothing broadcast rank 0's weights to {ranks_list(lone)} before the first step, so a "
                       "checkpoint loaded or a seed drawn on one rank would start them apart; "
                       f"hvd.broadcast_parameters(model.state_dict(), root_rank=0) ({CHAPTER}, item 3)")
    how = "by the DDP wrapper" if _used(run, "ddp") else "by a broadcast"
    return Verdict("PASS", "broadcast", f"every rank starts from rank 0's weights ({how}; digest {firsts[0]['w']})")


def _passes(events: list[dict]) -> list[tuple[int, int, dict]]:
    """Each training pass of a rank with its loader and that loader's epoch count so far."""
    seen: dict[int, int] = {}
    out = []
    for e in events:
        if e["e"] == "pass":
            seen[e["loader"]] = seen.get(e["loader"], 0) + 1
        elif e["e"] == "fwd":
            out.append((e["loader"], seen.get(e["loader"], 0) if e["loader"] is not None else 0, e))
    return out


def data(run: Run) -> Verdict:
    per_rank = fwds(run)
    n = min(map(len, per_rank.values()), default=0)
    if n == 0:
        return Verdict("SKIP", "data", "no training pass to compare")
    by_index = all(per_rank[r][i]["idx"] is not None for r in per_rank for i in range(n))
    what = "samples (the DataLoader's indices)" if by_index else "inputs (their digests)"
    same = [i for i in range(n) if len({str(per_rank[r][i]["idx"] if by_index else per_rank[r][i]["x"])
                                        for r in per_rank}) == 1]
    if same:
        return Verdict("FAIL", "data", f"every rank fed the same {what} at {len(same)} of {n} steps: each rank "
                       "needs its own shard, a DistributedSampler(dataset, num_replicas=size, rank=rank) in place "
                       "of shuffle=True (or your own cut, by rank), with the same seed on every rank "
                       f"({CHAPTER}, item 4)")
    if by_index:
        overlap = _overlap(run)
        if overlap is not None:
            return overlap
    return Verdict("PASS", "data", f"the ranks fed other {what} at each of {n} steps"
                   + (", no sample on two ranks in one epoch" if by_index else ""))


def _overlap(run: Run) -> Verdict | None:
    shards: dict[tuple, dict[int, set]] = {}
    for r, rank in run.ranks.items():
        for loader, epoch, e in _passes(rank.events):
            shards.setdefault((loader, epoch), {}).setdefault(r, set()).update(map(str, e["idx"]))
    for (_, epoch), by_rank in sorted(shards.items()):
        ranks = sorted(by_rank)
        for a in ranks:
            for b in ranks[ranks.index(a) + 1:]:
                shared, least = len(by_rank[a] & by_rank[b]), min(len(by_rank[a]), len(by_rank[b]))
                if shared > max(len(run.ranks), 0.05 * least):  # DistributedSampler pads with a few
                    return Verdict("FAIL", "data", f"ranks {a} and {b} trained {shared} of the same {least} samples "
                                   f"in epoch {epoch}: their shards overlap (a sampler with another num_replicas "
                                   f"or rank, or another seed on each rank) ({CHAPTER}, item 4)")
    return None


def reshuffle(run: Run) -> Verdict:
    orders: dict[int, dict[int, list]] = {}
    for r, rank in run.ranks.items():
        for loader, epoch, e in _passes(rank.events):
            if loader is not None and e["idx"] is not None:
                orders.setdefault(r, {}).setdefault(epoch, []).append(e["idx"])
    if not orders:
        return Verdict("SKIP", "reshuffle", "the script feeds no DataLoader: the check cannot see its epochs' order")
    if min(len(o) for o in orders.values()) < 2:
        return Verdict("SKIP", "reshuffle", "the run ended in its first epoch: give ARGS that make an epoch "
                       "shorter than half of --steps to see a second")
    first = {r: sorted(o)[:2] for r, o in orders.items()}
    if all(sum(o[first[r][0]], []) == sorted(sum(o[first[r][0]], [])) for r, o in orders.items()):
        return Verdict("SKIP", "reshuffle", "the loader does not shuffle (epoch 1 came in index order)")
    repeated = sorted(r for r, o in orders.items()
                      if o[first[r][0]][:len(o[first[r][1]])] == o[first[r][1]][:len(o[first[r][0]])])
    if repeated:
        return Verdict("FAIL", "reshuffle", f"epoch 2 repeats epoch 1's order on {ranks_list(repeated)}: call "
                       f"sampler.set_epoch(epoch) at the start of every epoch ({CHAPTER}, item 4)")
    return Verdict("PASS", "reshuffle", "every rank's second epoch came in a new order")


def lockstep(run: Run) -> Verdict:
    lengths: dict[int, list[int]] = {}
    for r, rank in run.ranks.items():
        per_epoch: dict[tuple, int] = {}
        for loader, epoch, _ in _passes(rank.events):
            per_epoch[(loader, epoch)] = per_epoch.get((loader, epoch), 0) + 1
        lengths[r] = [per_epoch[k] for k in sorted(per_epoch, key=lambda k: (k[0] is None, k))]
    totals = {r: len(rank.of("fwd")) for r, rank in run.ranks.items()}
    if len(set(totals.values())) == 1 and len({tuple(v) for v in lengths.values()}) == 1:
        return Verdict("PASS", "lockstep", f"every rank took {totals[0]} training steps"
                       + (f", {lengths[0][0]} in its first epoch" if lengths[0] and len(lengths[0]) > 1 else ""))
    where = next((i for i in range(max(map(len, lengths.values())))
                  if len({tuple(v[i:i + 1]) for v in lengths.values()}) > 1), None)
    counts = ", ".join(f"rank {r} {lengths[r][where] if where is not None and where < len(lengths[r]) else totals[r]}"
                       for r in sorted(lengths))
    hung = f"; the check stopped the run: {run.stopped}" if run.stopped else ""
    return Verdict("FAIL", "lockstep", f"the ranks took different numbers of steps ({counts}"
                   f"{f' in epoch {where + 1}' if where is not None else ''}): a rank left the loop alone (a "
                   "break or continue under `if rank == 0`), or the shards differ in length (drop_last=True); "
                   f"the others then wait in their next allreduce{hung} ({CHAPTER}, item 8)")


def gradients(run: Run) -> Verdict:
    per_rank = fwds(run)
    n = min(map(len, per_rank.values()), default=0)
    clips = [e for rank in run.ranks.values() for e in rank.of("clip")]
    if clips:
        return Verdict("FAIL", "gradients", f"gradients clipped at {len(clips)} steps while Horovod was still "
                       "averaging them, so each rank clips its own: call optimizer.synchronize(), clip, then "
                       f"step inside `with optimizer.skip_synchronize():` ({CHAPTER}, item 3)")
    if n < 2:
        return Verdict("SKIP", "gradients", "fewer than two training steps to compare")
    apart = next((i for i in range(1, n) if len({per_rank[r][i]["w"] for r in per_rank}) > 1), None)
    if apart is None:
        return Verdict("PASS", "gradients", f"the weights are equal on every rank after each of {n - 1} updates")
    gap = max_difference(run.weights(0), run.weights(min(set(per_rank) - {0})))
    seen = f"the ranks' weights part after update {apart}" + (f" (largest difference {gap:.3g} at the end)"
                                                               if gap is not None else "")
    return Verdict("FAIL", "gradients", f"{seen}: {_cause(run)} ({CHAPTER}, item 3)")


def _cause(run: Run) -> str:
    steps = [e for rank in run.ranks.values() for e in rank.of("step")]
    bare = any(e["bare"] for f in fwds(run).values() for e in f)
    if bare:
        return "the loop calls the bare model, not the DDP wrapper around it, so its gradients are never averaged; " \
               "call the wrapper (ddp_model(x)) in the training loop"
    if _used(run, "horovod") and not steps:
        return "the weights are updated by hand (no optimizer.step()), so no hvd.DistributedOptimizer averages " \
               "the gradients: average each first, hvd.allreduce_(p.grad, op=hvd.Average), or use a wrapped optimizer"
    if _used(run, "horovod") and not any(e["horovod"] for e in steps):
        return "the optimizer is not wrapped: optimizer = hvd.DistributedOptimizer(optimizer, " \
               "named_parameters=model.named_parameters())"
    if not _used(run, "ddp") and not _used(run, "horovod"):
        what = "the weights are updated by hand and" if not steps else "the model is not wrapped:"
        return f"{what} nothing averages the gradients; wrap the model in DistributedDataParallel " \
               "(or average each gradient with dist.all_reduce, divided by the world size)"
    return "something changes one rank's weights or gradients alone (code between backward() and step() " \
           "that differs by rank, or an update under `if rank == 0`)"


def _flag(run: Run, names: tuple[str, ...]) -> tuple[str, float] | None:
    for rank in run.ranks.values():
        for e in rank.of("args"):
            for name in names:
                value = e["values"].get(name)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    return name, float(value)
    return None


def steps_per_epoch(run: Run) -> int | None:
    """The first epoch's length in steps (rank 0): where its training loader began a second
    pass, or else where it first evaluated."""
    rank = run.ranks[0]
    starts = [e["pos"] for e in rank.of("pass") if e["loader"] == next(
        (f["loader"] for f in rank.of("fwd") if f["loader"] is not None), None)]
    if len(starts) > 1 and starts[1] > starts[0]:
        return starts[1] - starts[0]
    return next((e["pos"] for e in rank.of("fwd") if e["evals"] and e["pos"] > 0), None)


def learning_rate(run: Run, lr: float | None, warmup: float | None) -> Verdict:
    steps = {r: rank.of("step") for r, rank in run.ranks.items()}
    n = min(map(len, steps.values()), default=0)
    if n == 0:
        return Verdict("SKIP", "lr", "the script takes no optimizer step (a hand-written update): the check "
                       "cannot see its learning rate")
    for i in range(n):
        values = {r: steps[r][i]["lr"] for r in steps}
        if len({tuple(v) for v in values.values()}) > 1:
            said = ", ".join(f"rank {r} {v[0]:.6g}" for r, v in sorted(values.items()))
            return Verdict("FAIL", "lr", f"the ranks used different learning rates at step {i} ({said}): compute "
                           "it from what every rank shares (the step count, a loss summed over the ranks), not "
                           f"from a rank's own counts ({CHAPTER}, item 6)")
    rates = [s["lr"][0] for s in steps[0][:n]]
    span = f"{min(rates):.4g} to {max(rates):.4g}" if min(rates) != max(rates) else f"{rates[0]:.4g}"
    told = ("--lr", lr) if lr is not None else _flag(run, LR_FLAGS)
    if told is None:
        return Verdict("PASS", "lr", f"every rank used the same learning rate at each of {n} steps ({span}); give "
                       "--lr ONE_GPU_RATE (and --warmup-epochs) to check the scaling rule and the warmup")
    source = "--lr" if lr is not None else f"the script's --{told[0].replace('_', '-')}"
    warm = warmup if warmup is not None else (_flag(run, WARMUP_FLAGS) or (None, 0.0))[1]
    opt, workers = steps[0][0]["opt"], len(run.ranks)
    found = [_schedule(rates, told[1], warm, workers, rule, steps_per_epoch(run))
             for rule in (("linear", "sqrt") if opt in ADAPTIVE else ("linear",))]
    passed = [text for ok, text in found if ok]
    if passed:
        return Verdict("PASS", "lr", f"every rank used the same learning rate at each of {n} steps; {passed[0]} "
                       f"(one-GPU rate {told[1]:g} from {source})")
    return Verdict("FAIL", "lr", f"{found[0][1]} (one-GPU rate {told[1]:g} from {source}; if that is not the "
                   f"one-GPU rate, give check-script --lr) ({CHAPTER}, items 5 and 6)")


def _schedule(rates: list[float], lr: float, warm: float, workers: int, rule: str,
              spe: int | None) -> tuple[bool, str]:
    """Whether the rates follow ``rule`` with the chapter's warmup, and what they follow or
    where they leave it first."""
    peak = lr * (workers if rule == "linear" else math.sqrt(workers))
    named = f"the {'linear' if rule == 'linear' else 'square-root'} rule's peak {peak:.6g} ({workers} workers)"
    ramp = round(warm * spe) if warm and spe else None

    def wanted(s: int) -> float | None:
        if not warm:
            return peak if s == 0 else None
        if ramp is None:
            return lr if s == 0 else None
        return lr + (peak - lr) * s / ramp if s < ramp else None  # after it, the script's own schedule

    for s, rate in enumerate(rates):
        want = wanted(s)
        if (want is not None and not math.isclose(rate, want, rel_tol=1e-6)) or rate > peak * (1 + 1e-9):
            hint = ("; the rate is not scaled" if math.isclose(rate, lr, rel_tol=1e-6) and not warm else
                    "; it starts at the peak, with no warmup" if warm and s == 0 and math.isclose(rate, peak) else
                    "; a scheduler stepped once per epoch acts during the warmup" if spe and s % spe == 0 else "")
            return False, (f"at step {s} the learning rate is {rate:.6g}, where {named} "
                           + (f"after a gradual warmup over {warm:g} epoch(s) from {lr:g} " if warm else "")
                           + f"gives {want if want is not None else peak:.6g}{hint}")
    epochs = f"{warm:g} epoch{'' if warm == 1 else 's'}"
    checked = (f"a gradual warmup from {lr:g} over {epochs} of {spe} steps to {named}" if ramp else
               f"a warmup from {lr:g} (its length unseen: no second epoch in this run)" if warm else named)
    return True, f"the rates follow {checked}"


def checkpoints(run: Run) -> Verdict:
    writers: dict[str, set[int]] = {}
    saves = 0
    for r, rank in run.ranks.items():
        for e in rank.of("save"):
            if e["path"] is not None:
                writers.setdefault(e["path"], set()).add(r)
                saves += 1
    if not writers:
        return Verdict("SKIP", "checkpoint", "the script saved nothing with torch.save in this run")
    shared = {p: rs for p, rs in writers.items() if len(rs) > 1}
    if shared:
        path, ranks = next(iter(sorted(shared.items())))
        return Verdict("FAIL", "checkpoint", f"{ranks_list(ranks)} all wrote {path}: processes writing one file at "
                       "once can leave it torn or mixed; save on rank 0 alone (`if rank == 0:`), or give each rank "
                       f"a path of its own ({CHAPTER}, item 8)")
    owners = sorted({r for rs in writers.values() for r in rs})
    files = ", ".join(sorted(writers)[:3]) + (" ..." if len(writers) > 3 else "")
    who = "rank 0 alone" if owners == [0] else "each rank to files of its own"
    return Verdict("PASS", "checkpoint", f"{who} wrote {files} ({saves} saves)")
