"""``python -m guide_utils check-script``: before the queue, prove that your own training
script distributes correctly, on this machine's CPUs, in a minute or two.

    python -m guide_utils check-script [--launcher torchrun|horovodrun] [--workers N]
        [--steps N] [--no-resume] [--lr LR] [--warmup-epochs E] -- SCRIPT [ARGS...]

It runs SCRIPT, unchanged, under the real launcher (guessed from its imports when not
given: horovodrun for ``horovod.torch``, torchrun for ``torch.distributed``) with N workers
(default 2) on the CPU, over Gloo, for at most --steps optimizer steps; then twice more,
warned by SIGUSR1 (Slurm's warning, as the guide's batch scripts pass it on) in the middle
of an epoch and at an epoch's end, and each time started again with the same command. A
module loaded into every worker before the script watches it from outside (forward passes,
optimizer steps, DataLoader batches, torch.save): the script imports nothing from the guide.
It prints one line per check, PASS, FAIL or SKIP, its name and the evidence, and exits 1 if
any check fails (2: the input was wrong):

  broadcast   every rank starts from rank 0's weights
  data        the ranks see different samples at every step, no sample on two in an epoch
  reshuffle   the second epoch comes in a new order (set_epoch)
  lockstep    every rank takes the same number of steps
  gradients   the weights agree on every rank after every update
  lr          every rank uses the same learning rate; with --lr (or the script's own --lr and
              --warmup-epochs), the linear rule and the gradual warmup chapter 16 prescribes
  checkpoint  one rank writes each checkpoint file (or each rank its own path)
  resume      warned mid-epoch, it stops, saves, exits 75, resumes, and ends with the
              weights of the unbroken run at the same step
  epoch-end   the same, warned on an epoch's last step: that epoch's end-of-epoch work
              (validation, a per-epoch scheduler, metrics) is done exactly once
  exit        every rank exits by itself: 0 when done, 75 when warned

Give ARGS that make the script small: a few steps per epoch (the epoch checks need a second
epoch within --steps), little data, the CPU as its device. Every run starts in a fresh
folder of its own, so paths in ARGS (a dataset) should be absolute, and a checkpoint path
relative (the check refuses to let the script write outside that folder).
"""

from __future__ import annotations

import argparse
import ast
import shutil
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...core.cli import ArgumentParser, one_line_errors
from ...core.errors import GuideError
from ...runtime.launch import BIN
from . import resume, runs, verdicts
from .verdicts import Verdict

LAUNCHERS = ("torchrun", "horovodrun")
TENSORFLOW = ("tensorflow", "keras", "horovod.tensorflow", "horovod.keras")


@dataclass
class Report:
    script: Path
    launcher: str
    verdicts: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # lines quoted under a failure
    folder: Path | None = None
    seconds: float = 0.0  # every run of the check, in all

    @property
    def failed(self) -> bool:
        return any(v.status == "FAIL" for v in self.verdicts)

    def lines(self, width: int | None = None) -> list[str]:
        """One line per check (wrapped at ``width``, the evidence indented under itself), then
        the lines quoted under a failure."""
        if not width:
            return [v.line() for v in self.verdicts] + self.notes
        indent = " " * len(Verdict("PASS", "", "").line())
        return [textwrap.fill(v.line(), width, subsequent_indent=indent) for v in self.verdicts] + \
            [line[:width] for line in self.notes]


def imports(script: Path) -> set[str]:
    try:
        tree = ast.parse(script.read_text(), filename=str(script))
    except SyntaxError as exc:
        raise GuideError(f"{script} is not Python that parses ({exc.msg}, line {exc.lineno}); fix it first") from None
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    return names


def guess_launcher(script: Path) -> str:
    """The launcher the script is written for, from what it imports."""
    names = imports(script)
    if any(n == t or n.startswith(t + ".") for n in names for t in TENSORFLOW):
        raise GuideError(f"{script.name} is a TensorFlow/Keras script; check-script checks PyTorch scripts (for "
                         "Keras, run it with two workers as chapter 16's tests do and compare the ranks' weights)")
    if any(n == "horovod.torch" or n.startswith("horovod.torch.") for n in names):
        return "horovodrun"
    if any(n.startswith(("torch.distributed", "torch.nn.parallel")) for n in names):
        return "torchrun"
    raise GuideError(f"{script.name} imports neither horovod.torch nor torch.distributed, so it trains in one "
                     "process; make it distributed with chapter 16's checklist first (or name --launcher)")


def _say(quiet: bool):
    return (lambda text: None) if quiet else (lambda text: print(text, file=sys.stderr, flush=True))


def _launch(ctx: dict, name: str, cwd: str, **settings) -> runs.Run:
    run = runs.launch(ctx["launcher"], ctx["workers"], ctx["script"], ctx["args"], ctx["folder"], name,
                      ctx["folder"] / cwd, {"steps": ctx["steps"], **settings}, ctx["timeout"],
                      checked=ctx.get("checked", False))
    ends = sorted({r.end["pos"] for r in run.ranks.values() if r.end})
    threads = sorted({e["threads"] for r in run.ranks.values() for e in r.of("start")})
    crash = resume.died(run)
    how = f"rank {crash[0]} failed" if crash else f"ended at step {'/'.join(map(str, ends)) or '?'}"
    ctx["say"](f"  {name:<12} {run.seconds:5.1f} s, {how}, {'/'.join(map(str, threads)) or '?'} thread(s) a "
               "worker" + (f" ({run.stopped})" if run.stopped else ""))
    return run


def _broken(run: runs.Run, report: Report) -> bool:
    """Whether the unbroken run failed before there was anything to check; says why."""
    crash = resume.died(run)
    trained = any(rank.of("fwd") for rank in run.ranks.values())
    if crash is None and trained:
        return False
    rank = crash[0] if crash else 0
    log = run.ranks[rank].log + run.output
    if verdicts.asks_for_cuda(log):
        raise GuideError(f"rank {rank} asks for CUDA, which this machine does not have; choose the device from "
                         f"what is there, {verdicts.DEVICE_FIX} (chapter 16, item 2), or pass the script's CPU flag")
    if crash is None:
        why = run.stopped or "it ended without a training forward pass"
        report.verdicts.append(Verdict("FAIL", "run", f"no rank trained: {why}"))
    else:
        # A crash two ranks writing one file can cause (a rename that finds the file gone): say so first
        shared = verdicts.checkpoints(run)
        report.verdicts += [shared] if shared.status == "FAIL" else []
        report.verdicts.append(Verdict("FAIL", "run", f"rank {crash[0]} {crash[1]}"))
    tail = run.ranks[rank].tail() or "\n".join(run.output.strip().splitlines()[-6:])
    report.notes += [f"      last lines of rank {rank}:"] + [f"      | {line}" for line in tail.splitlines()]
    return True


def _resumes(ctx: dict, unbroken: runs.Run) -> tuple[list[Verdict], list[runs.Run]]:
    """Warn mid-epoch, start again; warn that run on an epoch's last step, start again: a job
    requeued twice, each stop compared with the unbroken run."""
    a = resume.mid_epoch(unbroken)
    if a is None:
        short = f"the run took {resume.length(unbroken)} steps, too few to stop in the middle"
        return [resume.stop_and_resume(resume.MID, unbroken, None, None, why=short),
                resume.stop_and_resume(resume.END, unbroken, None, None, why=short)], []
    table = str(ctx["folder"] / "unbroken")
    mid = _launch(ctx, "mid", "resumed", signal_at=a)
    b = _stop(mid)
    s = resume.epoch_end(unbroken, a, b) if b is not None else None
    s = s if s is not None and b is not None and s > b else None
    again = _launch(ctx, "mid-restart", "resumed", table=table, base=b, signal_at=s) if b is not None else None
    c = _stop(again) if again is not None and s is not None else None
    if c is not None and resume.stop_and_resume(resume.MID, unbroken, mid, again, again).status == "FAIL":
        c = None  # the first resume failed already: no second to check on top of it
    last = _launch(ctx, "end-restart", "resumed", table=table, base=c) if c is not None else again
    done = [r for r in (mid, again, last) if r is not None]
    first = resume.stop_and_resume(resume.MID, unbroken, mid, again, last)
    if first.name == "epoch-end":  # it stops at epoch ends only: no mid-epoch stop to check
        return [Verdict("SKIP", "resume", f"warned in the middle of an epoch (after step {a}), the script went on "
                        f"to the epoch's end (step {b}) before it stopped: see epoch-end"), first], done
    if s is None or (c is None and first.status == "FAIL"):
        why = "the first resume failed" if first.status == "FAIL" else "no epoch of this run ends after the " \
            "first stop with a step left: give ARGS with shorter epochs or a larger --steps"
        return [first, resume.stop_and_resume(resume.END, unbroken, None, None, why=why)], done
    second = resume.stop_and_resume(resume.END, unbroken, again, last if c is not None else None)
    if c is not None and c not in resume.epoch_ends(unbroken) and second.status != "FAIL":
        second = Verdict("SKIP", "epoch-end", f"warned on the last step of an epoch (step {s}), the script went on "
                         f"to step {c} before it stopped: it looks for the warning every few steps, and no epoch "
                         "of this run ends on such a step (give ARGS whose epoch length is a multiple of that)")
    return [first, second], done


def _stop(run: runs.Run) -> int | None:
    """Where a warned run stopped with 75, if it did."""
    return next((r.end["pos"] for r in run.ranks.values() if r.end and r.end["code"] == 75), None)


def check(script: str | Path, args: list[str], *, launcher: str | None = None, workers: int = 2, steps: int = 50,
          resumes: bool = True, lr: float | None = None, warmup: float | None = None, timeout: float = 120,
          keep: str | Path | None = None, quiet: bool = False) -> Report:
    """Run every check on ``script ARGS`` (see the module's docstring); the records stay in
    ``keep`` if given (a new or empty folder), else in a temporary folder removed afterwards
    unless a check failed."""
    script = Path(script).expanduser()
    if not script.is_file():
        raise GuideError(f"{script}: no such script; give the path of your training script after --")
    if workers < 2:
        raise GuideError(f"--workers {workers}: the checks compare ranks, give at least 2")
    if steps < 4:
        raise GuideError(f"--steps {steps}: give at least 4 (a few epochs of a few steps each is best)")
    chosen = launcher or guess_launcher(script)
    if not (BIN / chosen).exists() and shutil.which(chosen) is None:
        raise GuideError(f"{chosen} not found in {BIN}; install the package that brings it (torch or horovod)")
    folder = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="check-script-"))
    if keep and folder.exists() and any(folder.iterdir()):
        raise GuideError(f"--keep {folder}: the folder is not empty; give a new one (the check never overwrites files)")
    folder.mkdir(parents=True, exist_ok=True)
    say = _say(quiet)
    report = Report(script, chosen, folder=folder)
    say(f"check-script: {script} under {chosen}{'' if launcher else ' (from its imports)'}, {workers} workers "
        f"on this machine's CPU, at most {steps} steps each run")
    ctx = {"launcher": chosen, "workers": workers, "script": script.resolve(), "args": list(args), "folder": folder,
           "steps": steps, "timeout": timeout, "say": say}
    start = time.monotonic()
    try:
        _check(ctx, report, lr, warmup, resumes)
        report.seconds = time.monotonic() - start
    except BaseException:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    if not keep and not report.failed:
        shutil.rmtree(folder, ignore_errors=True)
        report.folder = None
    return report


def _check(ctx: dict, report: Report, lr: float | None, warmup: float | None, resumes: bool) -> None:
    unbroken = _launch(ctx, "unbroken", "unbroken")
    if _broken(unbroken, report):
        return
    ctx["checked"] = True  # its launcher got the script to train: the later runs skip horovodrun's build check
    report.verdicts += [verdicts.broadcast(unbroken), verdicts.data(unbroken), verdicts.reshuffle(unbroken),
                        verdicts.lockstep(unbroken), verdicts.gradients(unbroken),
                        verdicts.learning_rate(unbroken, lr, warmup), verdicts.checkpoints(unbroken)]
    done = [unbroken]
    if resumes:
        found, more = _resumes(ctx, unbroken)
        report.verdicts += found
        done += more
    report.verdicts.append(resume.exits(done))


@one_line_errors("check-script")
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m guide_utils check-script", description=__doc__.split("\n\n")[0],
                            epilog="\n\n".join(__doc__.split("\n\n")[2:]),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launcher", choices=LAUNCHERS, help="default: from the script's imports")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps per run at most (default 50)")
    parser.add_argument("--no-resume", action="store_true", help="skip the warned and restarted runs")
    parser.add_argument("--lr", type=float, help="the script's learning rate on one GPU (default: its --lr)")
    parser.add_argument("--warmup-epochs", type=float, help="the warmup it should do (default: its --warmup-epochs)")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds to wait for the first training step, and between two events (default 120)")
    parser.add_argument("--keep", metavar="DIR", help="keep every run's records and output in DIR (a new folder)")
    parser.add_argument("--quiet", action="store_true", help="print the verdicts only")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no script given; put it after --, e.g. -- examples/your_script/train_ddp.py --epochs 2")
    report = check(command[0], command[1:], launcher=args.launcher, workers=args.workers, steps=args.steps,
                   resumes=not args.no_resume, lr=args.lr, warmup=args.warmup_epochs, timeout=args.timeout,
                   keep=args.keep, quiet=args.quiet)
    print("\n".join(report.lines(shutil.get_terminal_size((0, 0)).columns if sys.stdout.isatty() else None)))
    if report.folder is not None:
        print(f"the runs' records and output: {report.folder}")
    return 1 if report.failed else 0
