"""Stopped and started again: where to send the warning, and whether the resumed run is the
unbroken one.

A run is warned twice: once in the middle of its second epoch, and once on the last step of
an epoch, where the script's own loop must tell "this epoch trained" from "this epoch
finished" (its validation, its best-model copy, a scheduler stepped per epoch). A script
looks for the warning every few steps, not at every one; where the first warning stopped it
says how often, and the second is sent on an epoch end that is also such a step.
"""

from __future__ import annotations

import math

from .runs import Rank, Run
from .verdicts import CHAPTER, Verdict, explain, max_difference, ranks_list

MID, END = "mid-epoch", "epoch end"


def epoch_ends(run: Run) -> list[int]:
    """Positions after which rank 0 of the unbroken run ended an epoch: its training loader
    began another pass, or it evaluated, between two training steps."""
    rank = run.ranks[0]
    loader = next((f["loader"] for f in rank.of("fwd") if f["loader"] is not None), None)
    ends = {e["pos"] for e in rank.of("pass") if loader is not None and e["loader"] == loader}
    ends |= {e["pos"] for e in rank.of("fwd") if e["evals"]}
    return sorted(p for p in ends if p > 0)


def length(run: Run) -> int:
    end = run.ranks[0].end
    return end["pos"] if end else run.ranks[0].last_position


def mid_epoch(run: Run) -> int | None:
    """A step in the middle of the second epoch (the first, without epochs), odd and not a
    multiple of 5, so that where the script then stops tells how often it looks."""
    total, ends = length(run), epoch_ends(run)
    first = ends[0] if ends else 0
    start = first + max(1, (first or total) // 2)
    for a in range(start, total - 1):
        if a % 2 and a % 5 and a not in ends:
            return a
    return start if start < total - 1 else None


def cadences(signalled: int, stopped: int) -> list[int]:
    """How often a script may look for the warning, if one sent after step ``signalled``
    stopped it at step ``stopped``: every c steps, where c's first multiple from
    ``signalled`` on is ``stopped``.

    >>> cadences(19, 20)
    [2, 4, 5, 10, 20]
    >>> cadences(19, 19)
    [1, 19]
    """
    return [c for c in range(1, stopped + 1) if math.ceil(signalled / c) * c == stopped]


def epoch_end(run: Run, signalled: int | None, stopped: int | None) -> int | None:
    """The epoch end to send the second warning at: one the script looks at (a multiple of
    as many of the possible intervals as any), with a step left after it."""
    candidates = [p for p in epoch_ends(run) if p < length(run) - 1]
    if not candidates:
        return None
    every = cadences(signalled, stopped) if signalled is not None and stopped is not None else [1]
    return max(candidates, key=lambda p: (sum(p % c == 0 for c in every), -p))


# -- the verdicts ----------------------------------------------------------------------------------

def died(run: Run) -> tuple[int, str] | None:
    """The rank that crashed or was killed first, and how it ended, or None (a rank whose
    partner died first often fails too, in its next collective: that is not the cause)."""
    for r, rank in sorted(run.ranks.items(), key=lambda item: (item[1].end or {"t": math.inf})["t"]):
        end = rank.end
        if end is None:
            if any(e["e"] == "signal" for e in rank.events):
                return r, "was killed by the SIGUSR1 the check sent: the script installs no handler for it, so " \
                          f"the warning ends the process instead of asking it to save ({CHAPTER}, item 9)"
            if run.stopped or any(o.end and o.end["code"] == 75 for o in run.ranks.values()):
                continue  # ended by the check (a hang), or by the launcher after a partner's 75
            return r, "died without exiting (killed, or crashed in native code)"
        if end["error"] or end["code"] not in (0, 75):
            cause = explain(f"{end['error']}\n{rank.log}")
            text = f"crashed at step {end['pos']} ({end['where']}): {end['error'] or 'exit status ' + str(end['code'])}"
            return r, text + (f"; {cause}" if cause else "")
    return None


def _stopped(run: Run) -> str:
    return f"; the check stopped the run: {run.stopped}" if run.stopped else ""


def _work(rank: Rank) -> dict[int, list[int]]:
    """Evaluation passes and collectives at each position (the work between two steps)."""
    out: dict[int, list[int]] = {}
    for e in rank.events:
        if e["e"] in ("fwd", "end"):
            slot = out.setdefault(e["pos"], [0, 0])
            slot[0] += e.get("evals", 0)
            slot[1] += e.get("collectives", 0)
    return out


def _by_position(rank: Rank, kind: str) -> dict[int, dict]:
    """A rank's first event of ``kind`` at each position (of its first model, for passes)."""
    out: dict[int, dict] = {}
    for e in rank.of(kind):
        if e.get("m", 0) == 0:
            out.setdefault(e["pos"], e)
    return out


def _first_difference(unbroken: Rank, restart: Rank) -> tuple[int, str] | None:
    """The first position where the restart's weights leave the unbroken run's, and why."""
    u_fwd, r_fwd = _by_position(unbroken, "fwd"), _by_position(restart, "fwd")
    u_step, r_step = _by_position(unbroken, "step"), _by_position(restart, "step")
    end = restart.end
    if end and end.get("w") and end["pos"] in u_fwd:
        r_fwd.setdefault(end["pos"], {"w": end["w"]})
    for p in sorted(r_fwd):
        if p not in u_fwd or r_fwd[p]["w"] == u_fwd[p]["w"]:
            continue
        q = p - 1  # the update that made the difference, from equal weights
        a, b = u_fwd.get(q, {}), r_fwd.get(q, {})
        if (a.get("idx") or a.get("x")) != (b.get("idx") or b.get("x")):
            return q, "trained other samples than the unbroken run: the position in the epoch was not restored " \
                      "(set_epoch and skipping the batches already trained, in the sampler)"
        if q in u_step and q in r_step and u_step[q]["lr"] != r_step[q]["lr"]:
            return q, f"used the learning rate {r_step[q]['lr'][0]:.6g} where the unbroken run used " \
                      f"{u_step[q]['lr'][0]:.6g}: the scheduler's state was not restored, or a scheduler stepped " \
                      "per epoch was skipped or repeated at the stop"
        if q in u_step and q in r_step and u_step[q]["state"] != r_step[q]["state"]:
            return q, "started from another optimizer state (momentum, running averages): save " \
                      "optimizer.state_dict() and load it"
        if a.get("rng", [None])[0] != b.get("rng", [None])[0]:
            return q, "drew other random numbers (dropout, augmentation): save the random number generator's " \
                      "state, torch.get_rng_state() (every rank's, where ranks draw their own), and restore it"
        return q, "carried something from step to step that the checkpoint does not hold (a recurrent model's " \
                  "hidden state, a running statistic): save it too, each rank's own"
    return None


def _work_gap(unbroken: Rank, stopped: Rank, restart: Rank, stop: int, base: int, upto: int) -> str | None:
    """What end-of-epoch work the stopped and resumed runs did not do as the unbroken run did,
    from the stop up to (not including) ``upto``."""
    u, s, r = _work(unbroken), _work(stopped), _work(restart)
    for p in range(stop, upto):
        done = [(s.get(p, [0, 0])[k] if p == stop and base == stop else 0) + r.get(p, [0, 0])[k] for k in (0, 1)]
        want = u.get(p, [0, 0])
        if done[0] < want[0] or done[1] < want[1]:
            return f"after step {p} the unbroken run did {want[0]} evaluation passes and {want[1]} collectives " \
                   f"(metrics summed over the ranks), the stopped and resumed runs {done[0]} and {done[1]}: " \
                   "that epoch's end-of-epoch work was skipped"
        if want[0] and done[0] >= 2 * want[0]:
            return f"after step {p} the stopped and resumed runs evaluated {done[0]} batches, the unbroken run " \
                   f"{want[0]}: that epoch's end-of-epoch work was done twice"
    return None


def stop_and_resume(kind: str, unbroken: Run, stopped: Run | None, restart: Run | None, last: Run | None = None,
                    why: str = "") -> Verdict:
    """The verdict on one stop: ``stopped`` was warned, ``restart`` started after it, and
    ``last`` is the last run of the chain (whose weights at the end must be the unbroken run's)."""
    name = "resume" if kind == MID else "epoch-end"
    if stopped is None:
        return Verdict("SKIP", name, why)
    signal = stopped.first("signal")
    crash = died(stopped)
    if crash:
        step = signal and signal["pos"]
        return Verdict("FAIL", name, f"after the warning at step {step}, rank {crash[0]} {crash[1]}")
    ends = {r: rank.end for r, rank in stopped.ranks.items() if rank.end}
    if ends and all(e["how"] == "cap" or e["code"] != 75 for e in ends.values()):
        return Verdict("FAIL", name, f"the warning (SIGUSR1) after step {signal['pos']} did not stop the script "
                       f"before the check's limit at step {length(unbroken)}: it does not stop on Slurm's warning, "
                       f"or looks for it less often (a larger --steps tells which) ({CHAPTER}, item 9)")
    stops = {e["pos"] for e in ends.values()}
    if len(stops) > 1:
        return Verdict("FAIL", name, f"the ranks stopped at different steps ({sorted(stops)}): agree on the stop "
                       f"with an allreduce of a flag, every few steps ({CHAPTER}, item 9)")
    b = stops.pop()
    name = "epoch-end" if b in epoch_ends(unbroken) else "resume"
    at = f"warned after step {signal['pos']}, stopped at step {b}" + (" (an epoch's end)" if b in epoch_ends(unbroken)
                                                                       else "")
    return _restarted(name, at, unbroken, stopped, restart, last or restart, b)


def _restarted(name: str, at: str, unbroken: Run, stopped: Run, restart: Run, last: Run, b: int) -> Verdict:
    crash = died(restart)
    if crash:
        return Verdict("FAIL", name, f"{at}; started again, rank {crash[0]} {crash[1]}")
    begins = {r: rank.of("begin")[0]["base"] for r, rank in restart.ranks.items() if rank.of("begin")}
    base = begins.get(0, b)
    if base == 0 and b > 0:
        wrote = any(e["pos"] == b for rank in stopped.ranks.values() for e in rank.of("save"))
        why = "it did not load the checkpoint written at the stop" if wrote else "nothing was saved at the stop"
        return Verdict("FAIL", name, f"{at}; started again, it trained from step 0: {why} ({CHAPTER}, item 9)")
    if len(set(begins.values())) > 1:
        return Verdict("FAIL", name, f"{at}; started again, the ranks resumed at different steps {begins}")
    warned = restart.first("signal") is not None
    upto = min((r.end["pos"] for r in restart.ranks.values() if r.end), default=b) if warned else length(unbroken) + 1
    for r in sorted(restart.ranks):
        gap = _work_gap(unbroken.ranks[r], stopped.ranks[r], restart.ranks[r], b, base, upto)
        if gap:
            return Verdict("FAIL", name, f"{at}; on rank {r}, {gap}. Record in the checkpoint whether the epoch's "
                           "end is done, not only the step (`range(step // steps, ...)` cannot tell) "
                           f"({CHAPTER}, item 9)")
    return _weights(name, at, unbroken, restart, last, base, b)


def _weights(name: str, at: str, unbroken: Run, restart: Run, last: Run, base: int, b: int) -> Verdict:
    """The resumed weights against the unbroken run's: at the end of the chain, to float
    rounding; step by step (their digests) to say where and why they part."""
    target = length(unbroken)
    ends = {r.end["pos"] for r in last.ranks.values() if r.end}
    gaps = [max_difference(unbroken.weights(r), last.weights(r)) for r in sorted(last.ranks)] \
        if ends == {target} else [None]
    scale = max((t.abs().max().item() for m in unbroken.weights(0) or [] for t in m.values()
                 if t.is_floating_point() and t.numel()), default=1.0)
    worst = max((g for g in gaps if g is not None), default=None)
    apart = _buffers(unbroken, last) if worst is not None else []
    if 0 in apart:
        return Verdict("FAIL", name, f"{at}; rank 0's buffers (running statistics) after the restart are not the "
                       "unbroken run's: the checkpoint lacks them; save model.state_dict(), not only the parameters")
    redone = (f", redoing steps {base} to {b}" if base < b else "") + (
        f" (only {ranks_list(apart)}'s buffers, BatchNorm's running statistics, restarted from rank 0's, as "
        "Horovod's examples do; they change no weight)" if apart else "")
    stop = restart.ranks[0].end
    if stop and stop["code"] == 75 and stop["pos"] != target:  # warned again: compare up to there
        same = _by_position(unbroken.ranks[0], "fwd").get(stop["pos"], {}).get("w") == stop["w"]
        if same or (last is not restart and worst is not None and worst <= 1e-5 * max(scale, 1.0)):
            return Verdict("PASS", name, f"{at}; resumed at step {base}{redone}, trained as the unbroken run up "
                           f"to the next warning at step {stop['pos']} (equal weights), each epoch's end done once")
    elif worst is not None and worst <= 1e-5 * max(scale, 1.0):
        return Verdict("PASS", name, f"{at}; resumed at step {base}{redone}, ended at step {target} with the "
                       f"unbroken run's weights (largest difference {worst:.2g}), each epoch's end done once")
    for r in sorted(restart.ranks):
        wrong = _first_difference(unbroken.ranks[r], restart.ranks[r])
        if wrong:
            return Verdict("FAIL", name, f"{at}; the resumed run's rank {r}, at step {wrong[0]}, {wrong[1]} "
                           f"({CHAPTER}, item 10)")
    if ends != {target}:
        return Verdict("FAIL", name, f"{at}; the resumed runs ended at step {sorted(ends)}, the unbroken one at "
                       f"step {target}")
    return Verdict("FAIL", name, f"{at}; the resumed run ends at step {target} with other weights than the "
                   f"unbroken run (largest difference {worst:.3g})")


def _buffers(unbroken: Run, last: Run) -> list[int]:
    """The ranks whose buffers (BatchNorm's running statistics) the resumed run ends with
    otherwise than the unbroken run. Under Horovod each rank keeps its own, and a checkpoint
    written by rank 0 restarts every rank from rank 0's, as Horovod's own examples do: they
    decide no weight, only evaluation in between. Rank 0's must be its own."""
    return [r for r in sorted(last.ranks)
            if (max_difference(unbroken.weights(r, part="buffers"), last.weights(r, part="buffers")) or 0) > 1e-6]


def exits(runs: list[Run]) -> Verdict:
    """Every rank exits by itself: 0 (or the check's limit) when done, 75 when warned."""
    for run in runs:
        warned = run.first("signal") is not None
        for r, rank in sorted(run.ranks.items()):
            end = rank.end
            if end is None:
                if any(o.end and o.end["code"] == 75 for o in run.ranks.values()):
                    return Verdict("FAIL", "exit", f"rank {r} of the {run.name} run did not exit by itself: the "
                                   "launcher ended it after another rank exited with 75 (torchrun and horovodrun "
                                   "stop the others then); have every rank wait until the checkpoint is written "
                                   f"(a barrier), then all exit 75 ({CHAPTER}, item 9)")
                return Verdict("FAIL", "exit", f"rank {r} of the {run.name} run never exited{_stopped(run)}")
            if warned and end["how"] == "exit" and end["code"] != 75:
                return Verdict("FAIL", "exit", f"after the warning rank {r} exited with {end['code']}, not 75: the "
                               f"batch script requeues the job only on 75 ({CHAPTER}, item 9)")
    warned = sum(run.first("signal") is not None for run in runs)
    return Verdict("PASS", "exit", f"every rank of {'the run' if len(runs) == 1 else f'{len(runs)} runs'} exited "
                   "by itself"
                   + (f", with 75 after each of {warned} warnings" if warned else ""))


