"""``python -m guide_utils check-script``: the reader's own script, run unchanged on two CPU
workers under its launcher, checked from outside. Every PyTorch version in
examples/your_script passes (train_ddp.py in chapter 16's build: test_book.py), and a copy of
one with exactly one trap planted fails that trap's check with that trap's own message. The
verdicts' logic is tested first on records made up here, so that a wrong rule fails in
seconds, not after a launcher run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import child_env
from guide_utils.cluster.script_check import check, resume, verdicts
from guide_utils.cluster.script_check.runs import Rank, Run
from guide_utils.results import your_script

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "your_script"


# -- the verdicts, on records made up here -------------------------------------------------------

def fwd(pos, w="w0", idx=None, x="x", loader=0, evals=0, collectives=0, bare=False, rng="r", lr=()):
    return {"e": "fwd", "t": pos, "i": pos, "pos": pos, "m": 0, "w": w, "idx": idx, "x": x, "loader": loader,
            "evals": evals, "collectives": collectives, "bare": bare, "rng": [rng, None, "p"], "lr": list(lr)}


def step(n, lr=0.1, horovod=False, opt="SGD", state="s"):
    return {"e": "step", "t": n + 0.5, "n": n, "pos": n, "lr": [lr], "opt": opt, "horovod": horovod, "state": state}


def end(pos, code=0, how="exit", evals=0, collectives=0, w=None):
    return {"e": "end", "t": 1e9, "how": how, "code": code, "error": None, "where": None, "pos": pos, "w": w,
            "updates": pos, "trained": pos, "evals": evals, "collectives": collectives}


def run_of(*ranks: list[dict], name="unbroken", folder=Path("/nonexistent")) -> Run:
    return Run(name, folder, {r: Rank(r, events, "") for r, events in enumerate(ranks)}, 1.0, 0, "")


def steps_of(n, shard, weights=lambda i: f"w{i}", lrs=None, epoch=4, passes=True, **kw) -> list[dict]:
    """A rank's records of n steps on a DataLoader with epochs of ``epoch`` steps."""
    events = [{"e": "begin", "t": 0, "base": 0, "broadcasts": 1, "model": "M"}]
    for i in range(n):
        if passes and i % epoch == 0:
            events.append({"e": "pass", "t": i, "loader": 0, "sampler": "S", "epoch": i // epoch, "pos": i})
        events.append(fwd(i, w=weights(i), idx=shard(i), **kw))
        events.append(step(i, lr=lrs[i] if lrs else 0.1))
    return events + [end(n)]


def test_the_same_samples_on_every_rank_fail_the_data_check():
    same = run_of(steps_of(8, lambda i: [i, i + 100]), steps_of(8, lambda i: [i, i + 100]))
    verdict = verdicts.data(same)
    assert verdict.status == "FAIL"
    assert "the same samples (the DataLoader's indices) at 8 of 8 steps" in verdict.evidence
    shards = run_of(steps_of(8, lambda i: [2 * i]), steps_of(8, lambda i: [2 * i + 1]))
    assert verdicts.data(shards).status == "PASS"
    overlapping = run_of(steps_of(8, lambda i: [i % 4, 50 + i]), steps_of(8, lambda i: [(i + 1) % 4, 60 + i]))
    assert verdicts.data(overlapping).status == "FAIL" and "shards overlap" in verdicts.data(overlapping).evidence


def test_an_epoch_in_the_same_order_fails_the_reshuffle_check_and_an_unshuffled_loader_skips_it():
    again = run_of(steps_of(8, lambda i: [(7 * (i % 4)) % 5, 9]), steps_of(8, lambda i: [(3 * (i % 4)) % 5 + 10]))
    assert verdicts.reshuffle(again).status == "FAIL" and "set_epoch" in verdicts.reshuffle(again).evidence
    new = run_of(steps_of(8, lambda i: [(7 * i) % 9]), steps_of(8, lambda i: [(5 * i) % 11 + 20]))
    assert verdicts.reshuffle(new).status == "PASS"
    ordered = run_of(steps_of(8, lambda i: [i % 4]), steps_of(8, lambda i: [10 + i % 4]))
    assert verdicts.reshuffle(ordered).status == "SKIP"
    short = run_of(steps_of(3, lambda i: [i]), steps_of(3, lambda i: [i + 5]))
    assert "first epoch" in verdicts.reshuffle(short).evidence


def test_a_rank_that_leaves_the_loop_alone_fails_the_lockstep_check():
    rank0 = steps_of(12, lambda i: [2 * i])
    rank1 = [e for e in steps_of(12, lambda i: [2 * i + 1]) if not (e["e"] in ("fwd", "step") and e["pos"] == 3)]
    verdict = verdicts.lockstep(run_of(rank0, rank1))
    assert verdict.status == "FAIL" and "rank 0 4, rank 1 3 in epoch 1" in verdict.evidence
    assert "break or continue under `if rank == 0`" in verdict.evidence


@pytest.mark.parametrize("change, cause", [
    ({"bare": True}, "the loop calls the bare model"),
    ({"horovod_import": True, "no_steps": True}, "updated by hand"),
    ({"horovod_import": True}, "the optimizer is not wrapped"),
    ({"no_steps": True}, "the weights are updated by hand and nothing averages the gradients"),
    ({"ddp": True, "horovod_steps": True}, "something changes one rank's weights"),
], ids=["bare model", "hand update under Horovod", "optimizer not wrapped", "hand update, no DDP", "other"])
def test_weights_that_part_fail_the_gradients_check_with_their_cause(change, cause):
    ranks = []
    for r in range(2):
        events = steps_of(6, lambda i: [2 * i + r], weights=lambda i: f"w{i}" if i < 2 else f"w{i}-{r}",
                          bare=change.get("bare", False))
        if change.get("no_steps"):
            events = [e for e in events if e["e"] != "step"]
        for e in events:
            if e["e"] == "step":
                e["horovod"] = change.get("horovod_steps", False)
        extra = [{"e": "horovod", "t": 0}] if change.get("horovod_import") else []
        extra += [{"e": "ddp", "t": 0, "model": "M"}] if change.get("ddp") or change.get("bare") else []
        ranks.append(extra + events)
    verdict = verdicts.gradients(run_of(*ranks))
    assert verdict.status == "FAIL" and "part after update 2" in verdict.evidence and cause in verdict.evidence


def test_clipping_while_horovod_averages_fails_even_where_the_weights_agree():
    ranks = [[{"e": "clip", "t": 1, "pos": 0, "pending": 4}, *steps_of(4, lambda i: [2 * i + r])] for r in range(2)]
    verdict = verdicts.gradients(run_of(*ranks))
    assert verdict.status == "FAIL" and "optimizer.synchronize(), clip" in verdict.evidence


def _schedule(rates: list[float], opt="SGD", **flags) -> verdicts.Verdict:
    ranks = []
    for r in range(2):
        events = [{"e": "args", "t": 0, "values": {"lr": 0.05, **flags}}, *steps_of(len(rates), lambda i: [2 * i + r],
                                                                                     lrs=rates, epoch=8)]
        for e in events:
            if e["e"] == "step":
                e["opt"] = opt
        ranks.append(events)
    return verdicts.learning_rate(run_of(*ranks), None, None)


def test_the_learning_rate_check_holds_the_chapters_linear_rule_and_warmup():
    """lr_at's gradual warmup (the thesis's Appendix 13) from the one-GPU rate 0.05 to 0.1 over
    one epoch of 8 steps passes; a rate that starts at the peak, or is never scaled, fails."""
    chapter = [your_script.expected_lr(s, lr=0.05, workers=2, steps_per_epoch=8, warmup_epochs=1, milestones=(3,))
               for s in range(24)]
    assert chapter[0] == 0.05 and chapter[4] == pytest.approx(0.075) and chapter[8] == pytest.approx(0.1)
    assert _schedule(chapter, warmup_epochs=1).status == "PASS"
    peak = _schedule([0.1] * 24, warmup_epochs=1)
    assert peak.status == "FAIL" and "starts at the peak, with no warmup" in peak.evidence
    unscaled = _schedule([0.05] * 24)
    assert unscaled.status == "FAIL" and "the rate is not scaled" in unscaled.evidence
    sqrt = [your_script.expected_lr(s, lr=0.05, workers=2, steps_per_epoch=8, warmup_epochs=1, milestones=(),
                                    rule="sqrt") for s in range(24)]
    assert _schedule(sqrt, opt="Adadelta", warmup_epochs=1).status == "PASS"
    assert _schedule(sqrt, opt="SGD", warmup_epochs=1).status == "FAIL"


def test_ranks_on_different_learning_rates_fail():
    ranks = [steps_of(6, lambda i: [2 * i + r], lrs=[0.1 * (1 + r * (i > 2)) for i in range(6)]) for r in range(2)]
    verdict = verdicts.learning_rate(run_of(*ranks), None, None)
    assert verdict.status == "FAIL" and "different learning rates at step 3" in verdict.evidence


def test_one_checkpoint_file_written_by_two_ranks_fails():
    def saving(r, path):
        return [{"e": "save", "t": 1, "path": path, "pos": 4, "module_keys": False}, *steps_of(4, lambda i: [i + r])]

    shared = verdicts.checkpoints(run_of(saving(0, "ckpt"), saving(1, "ckpt")))
    assert shared.status == "FAIL" and "ranks 0 and 1 all wrote ckpt" in shared.evidence
    assert verdicts.checkpoints(run_of(saving(0, "ckpt"), steps_of(4, lambda i: [i]))).status == "PASS"
    assert verdicts.checkpoints(run_of(saving(0, "a0"), saving(1, "a1"))).evidence.startswith("each rank")


def test_a_warned_rank_must_exit_75_by_itself():
    signal = {"e": "signal", "t": 1, "pos": 3}
    warned = run_of([*steps_of(4, lambda i: [2 * i])[:-1], end(4, code=1)],
                    [signal, *steps_of(4, lambda i: [2 * i + 1])[:-1], end(4, code=1)], name="mid")
    assert "exited with 1, not 75" in resume.exits([warned]).evidence
    killed = run_of(steps_of(4, lambda i: [2 * i])[:-1], [signal, *steps_of(4, lambda i: [2 * i + 1])[:-1],
                                                          end(4, code=75)], name="mid")
    assert "the launcher ended it after another rank exited with 75" in resume.exits([killed]).evidence


def test_a_stop_at_an_epochs_end_that_skips_its_work_fails():
    """The pattern the chapter's templates had: stopped on the epoch's last step before the
    metrics were summed, resumed into the next epoch. Step 8 ends an epoch of 8 steps."""
    def steps(lo, hi, w="w"):
        return [fwd(p, w=f"{w}{p}", idx=[p], collectives=(2 if p == 8 else 0)) for p in range(lo, hi)]

    unbroken = run_of(steps(0, 12) + [end(12)], steps(0, 12) + [end(12)])
    stopped = run_of([*steps(0, 8), end(8, code=75, collectives=1)],
                     [{"e": "signal", "t": 0, "pos": 8}, *steps(0, 8), end(8, code=75, collectives=1)], name="end")
    for rank in stopped.ranks.values():
        for e in rank.events:
            e["collectives"] = 0 if e["e"] == "fwd" else e.get("collectives", 0)
    restart = run_of(*[[{"e": "begin", "t": 0, "base": 8, "broadcasts": 1, "model": "M"}]
                       + [dict(e, collectives=0) for e in steps(8, 12)] + [end(12)]] * 2, name="end-restart")
    verdict = resume.stop_and_resume(resume.END, unbroken, stopped, restart)
    assert verdict.status == "FAIL" and "after step 8 the unbroken run did 0 evaluation passes and 2 collectives" \
        in verdict.evidence and "range(step // steps, ...)" in verdict.evidence


def test_the_warnings_go_where_the_script_can_stop():
    """Mid-epoch: odd, not a multiple of 5, in the second epoch; at an epoch's end: one the
    script looks at, told by where the first warning stopped it."""
    unbroken = run_of(steps_of(70, lambda i: [i], epoch=12), steps_of(70, lambda i: [i], epoch=12))
    assert resume.epoch_ends(unbroken)[:3] == [12, 24, 36]
    a = resume.mid_epoch(unbroken)
    assert a == 19
    assert resume.cadences(19, 20) == [2, 4, 5, 10, 20]
    assert resume.epoch_end(unbroken, 19, 20) == 60  # every 10 steps: 60 is the first epoch end on one
    assert resume.epoch_end(unbroken, 19, 19) == 12  # every step: the first epoch end


# -- the command: bad input is one line -----------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--", "/no/such/train.py"], "/no/such/train.py: no such script"),
    (["--", str(EXAMPLES / "keras_train_horovod.py")], "is a TensorFlow/Keras script"),
    (["--", str(EXAMPLES / "train.py")], "imports neither horovod.torch nor torch.distributed"),
    (["--workers", "1", "--", str(EXAMPLES / "train_ddp.py")], "--workers 1: the checks compare ranks"),
    ([], "no script given; put it after --"),
], ids=["missing", "keras", "one process", "one worker", "nothing"])
def test_bad_input_is_one_line(argv, message, capsys):
    try:
        status = check.main(argv)
    except SystemExit as exit:  # argparse's own errors
        status = exit.code
    assert status == 2
    out, err = capsys.readouterr()
    (line,) = err.strip().splitlines()
    assert out == "" and message in line, line


def test_a_keep_folder_that_holds_files_is_refused_and_kept(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("a reader's file")
    assert check.main(["--keep", str(tmp_path), "--", str(EXAMPLES / "train_ddp.py")]) == 2
    assert "is not empty" in capsys.readouterr().err and (tmp_path / "mine.txt").read_text() == "a reader's file"


def test_workers_run_one_thread_each_unless_told_and_on_this_machine_alone(tmp_path, monkeypatch):
    """torchrun sets OMP_NUM_THREADS=1 where it is unset and horovodrun sets nothing, and CPU
    results depend on the thread count: the check gives every worker one, under either
    launcher, unless the reader set another. A Slurm job's or MPI's rank variables never
    reach the workers: they run on this machine, ranked by the launcher alone."""
    from guide_utils.cluster.script_check import runs

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("RANK", "3")
    env = runs.environment(tmp_path, "unbroken", {"steps": 70, "signal_at": None})
    assert env["OMP_NUM_THREADS"] == "1" and env["GUIDE_CHECK_STEPS"] == "70" and "GUIDE_CHECK_SIGNAL_AT" not in env
    assert "SLURM_PROCID" not in env and "RANK" not in env
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert runs.environment(tmp_path, "unbroken", {})["OMP_NUM_THREADS"] == "4"


def test_the_launcher_comes_from_the_scripts_imports():
    assert check.guess_launcher(EXAMPLES / "train_horovod.py") == "horovodrun"
    assert check.guess_launcher(EXAMPLES / "lm_train_ddp.py") == "torchrun"


def test_the_probe_refuses_to_write_outside_the_runs_folder(tmp_path):
    """A checkpoint path in ARGS that points at a reader's file is never written: the save
    raises inside the script, which the check reports."""
    script = tmp_path / "saver.py"
    target = tmp_path / "precious.pt"
    target.write_text("the reader's checkpoint")
    script.write_text(f"import torch\ntorch.save({{'a': 1}}, {str(target)!r})\n")
    (tmp_path / "run").mkdir()
    env = child_env(GUIDE_CHECK_DIR=str(tmp_path), GUIDE_CHECK_RUN="unbroken")
    proc = subprocess.run([sys.executable, "-m", "guide_utils.cluster.script_check.probe", str(script)],
                          cwd=tmp_path / "run", env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and target.read_text() == "the reader's checkpoint"
    events = [json.loads(line) for line in (tmp_path / "unbroken.rank0.jsonl").read_text().splitlines()]
    assert "refuses to let the script write" in events[-1]["error"]


def test_the_probe_records_a_loaders_indices_and_none_for_an_iterable_dataset(tmp_path):
    """One process, no launcher: a training pass fed by a map-style loader carries the batch's
    sample indices; one fed by an iterable dataset (no indices) carries none, so the data
    check compares its inputs instead of taking every batch for the same sample."""
    script = tmp_path / "loaders.py"
    script.write_text("""import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.randn(8, 4))

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for loader in (DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4, shuffle=True),
               DataLoader(Stream(), batch_size=4)):
    for batch in loader:
        x = batch[0] if isinstance(batch, list) else batch
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
""")
    (tmp_path / "run").mkdir()
    env = child_env(GUIDE_CHECK_DIR=str(tmp_path), GUIDE_CHECK_RUN="unbroken")
    proc = subprocess.run([sys.executable, "-m", "guide_utils.cluster.script_check.probe", str(script)],
                          cwd=tmp_path / "run", env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (tmp_path / "unbroken.rank0.log").read_text()
    events = [json.loads(line) for line in (tmp_path / "unbroken.rank0.jsonl").read_text().splitlines()]
    passes = [e["idx"] for e in events if e["e"] == "fwd"]
    assert [sorted(p) if p else p for p in passes[:2]] != [None, None] and passes[2:] == [None, None]
    assert sorted(passes[0] + passes[1]) == list(range(8))
    assert [e["n"] for e in events if e["e"] == "step"] == [0, 1, 2, 3]


# -- the examples, under their launchers ---------------------------------------------------------

FIRST = ["--epochs", "6", "--steps-per-epoch", "12", "--warmup-epochs", "1", "--milestones", "4",
         "--checkpoint", "ckpt"]
MNIST = ["--epochs", "6", "--samples", "384", "--warmup-epochs", "2", "--batch-size", "16", "--checkpoint",
         "ckpt", "--no-accel", "--test-batch-size", "100"]
IMAGENET = ["--epochs", "6", "--samples", "384", "--warmup-epochs", "2", "-b", "16", "--lr-step", "4",
            "--resume", "ckpt"]
LM = ["--epochs", "6", "--tokens", "3600", "--batch-size", "8", "--checkpoint", "ckpt"]
# Each version's flags (12 steps an epoch, so that the second warning lands on one's end), the
# checks it skips (the language model feeds no DataLoader, and DDP's update by hand has no
# optimizer whose learning rate the check could read), and the schedule every step's rate
# must be (lr_at's: the first script's drop at epoch 4, the MNIST shape's square-root rule and
# decay every epoch from the end of the warmup, the ImageNet shape's drop every 4 epochs; the
# language model's plateau rule follows its losses).
FIRST_LR = {"lr": 0.05, "steps_per_epoch": 12, "warmup_epochs": 1, "milestones": (4,)}
MNIST_LR = {"lr": 1.0, "steps_per_epoch": 12, "warmup_epochs": 2, "gamma": 0.7, "milestones": (3, 4, 5),
            "rule": "sqrt"}
IMAGENET_LR = {"lr": 0.1, "steps_per_epoch": 12, "warmup_epochs": 2, "milestones": (4,)}
VERSIONS = {"train_horovod.py": (FIRST, set(), FIRST_LR), "mnist_train_ddp.py": (MNIST, set(), MNIST_LR),
            "mnist_train_horovod.py": (MNIST, set(), MNIST_LR), "imagenet_train_ddp.py": (IMAGENET, set(), IMAGENET_LR),
            "imagenet_train_horovod.py": (IMAGENET, set(), IMAGENET_LR),
            "lm_train_ddp.py": (LM, {"reshuffle", "lr"}, None), "lm_train_horovod.py": (LM, {"reshuffle"}, None)}
CHECKS = ["broadcast", "data", "reshuffle", "lockstep", "gradients", "lr", "checkpoint", "resume", "epoch-end", "exit"]


def test_every_pytorch_version_is_checked_here_or_in_the_book():
    pytorch = {n for n in your_script.VERSIONS if not n.startswith("keras")}
    assert pytorch == set(VERSIONS) | {"train_ddp.py"}


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", list(VERSIONS))
def test_every_version_passes_the_whole_check(name, tmp_path):
    args, skipped, schedule = VERSIONS[name]
    report = check.check(EXAMPLES / name, args, steps=70, quiet=True, keep=tmp_path / "records")
    assert [v.name for v in report.verdicts] == CHECKS, report.lines()
    assert {v.name for v in report.verdicts if v.status != "PASS"} == skipped, "\n".join(report.lines())
    assert re.search(r"stopped at step 20;", report.verdicts[7].evidence)
    assert re.search(r"stopped at step 60 \(an epoch's end\); resumed at step 60", report.verdicts[8].evidence)
    if schedule is not None:  # every step's rate, as the unbroken run's rank 0 stepped with it
        events = map(json.loads, (tmp_path / "records" / "unbroken.rank0.jsonl").read_text().splitlines())
        rates = [e["lr"][0] for e in events if e["e"] == "step"]
        assert len(rates) == 70
        assert rates == pytest.approx([your_script.expected_lr(s, workers=2, **schedule) for s in range(70)],
                                      rel=1e-8)


def _trap(tmp_path: Path, base: str, changes: list[tuple[str, str]]) -> Path:
    """A copy of example ``base`` with ``changes`` made, each found exactly once."""
    text = (EXAMPLES / base).read_text()
    for old, new in changes:
        assert text.count(old) == 1, (base, old)
        text = text.replace(old, new)
    path = tmp_path / base
    path.write_text(text)
    return path


HVD_STEP = '''        optimizer.synchronize()  # the averaged gradients, before they are clipped
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.param_groups[0]["lr"] = lr
        with optimizer.skip_synchronize():  # averaged already
            optimizer.step()'''
RANK0_BREAK = '''            if run["rank"] == 0:  # only printing goes under the guard: every rank must break
                print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.sampler)}]"
                      f"  step {run['step']} lr {scheduler.get_last_lr()[0]:.10g}"
                      f"  Loss: {loss.item():.6f}")
            if args.dry_run:
                break'''
EPOCH_END_FIX = '''        if stop_requested(stop, device):  # warned at the epoch's end: stop now that it is done
            raise SystemExit(75)
'''
# Each trap: the example it is planted in, the change, the flags, whether the check runs the
# warned runs, and the check that must fail with the words of its message.
TRAPS = {
    "no sampler": ("train_ddp.py", [("sampler=sampler,\n", "shuffle=True,\n")], FIRST, False,
                   "data", "fed the same samples"),
    "sampler beside shuffle": ("mnist_train_ddp.py", [('train_kwargs = {"batch_size": args.batch_size}',
                                                      'train_kwargs = {"batch_size": args.batch_size, '
                                                      '"shuffle": True}')],
                               MNIST, False, "run", "DataLoader refuses a sampler beside shuffle=True"),
    "no set_epoch": ("train_ddp.py", [("        sampler.set_epoch(epoch)  #", "        #")], FIRST, False,
                     "reshuffle", "call sampler.set_epoch(epoch)"),
    "no broadcast": ("train_horovod.py", [("    hvd.broadcast_parameters(model.state_dict(), root_rank=0)", "    #")],
                     FIRST, False, "broadcast", "nothing broadcast rank 0's weights"),
    "bare model": ("train_ddp.py", [("out = ddp_model(x)", "out = model(x)")], FIRST, False,
                   "gradients", "the loop calls the bare model"),
    "optimizer not wrapped": ("train_horovod.py", [("    optimizer = hvd.DistributedOptimizer(optimizer, "
                                                    "named_parameters=model.named_parameters())\n", "")],
                              FIRST, False, "gradients", "the optimizer is not wrapped"),
    "update by hand": ("lm_train_horovod.py", [
        (HVD_STEP, "        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)\n"
                   "        for p in model.parameters():\n            p.data.add_(p.grad, alpha=-lr)"),
        ("    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())\n", ""),
        ("        optimizer.zero_grad()", "        model.zero_grad()")],
        LM, False, "gradients", "the weights are updated by hand (no optimizer.step())"),
    "clipping before synchronize": ("lm_train_horovod.py", [
        (HVD_STEP, "        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)\n"
                   '        optimizer.param_groups[0]["lr"] = lr\n        optimizer.step()')],
        LM, False, "gradients", "clipped at"),
    "rank guard around a break": ("mnist_train_ddp.py", [(RANK0_BREAK, RANK0_BREAK.replace(
        "            if args.dry_run:\n                break",
        "                if args.dry_run:\n                    break"))],
        [*MNIST, "--dry-run"], False, "lockstep", "a rank left the loop alone"),
    "wrapped model saved": ("train_ddp.py", [("save_checkpoint(args.checkpoint, model, optimizer, scheduler, step)\n"
                                              "                dist.barrier()",
                                              "save_checkpoint(args.checkpoint, ddp_model, optimizer, scheduler, "
                                              "step)\n                dist.barrier()")],
                            FIRST, True, "resume", "the checkpoint holds the DDP wrapper's keys"),
    "RNG not restored": ("train_ddp.py", [("        torch.set_rng_state(state[\"rng\"])\n", "")], FIRST, True,
                         "resume", "drew other random numbers"),
    "one checkpoint path for all": ("train_ddp.py", [("        if rank == 0:  # one line per epoch, one writer",
                                                      "        if True:  # one line per epoch, one writer")],
                                    FIRST, False, "checkpoint", "ranks 0 and 1 all wrote ckpt"),
    "stop on an epoch's last step": ("train_ddp.py", [("step % 10 == 0 and step % steps and", "step % 10 == 0 and"),
                                                      (EPOCH_END_FIX, "")],
                                     ["--epochs", "4", "--steps-per-epoch", "10", "--warmup-epochs", "1",
                                      "--checkpoint", "ckpt"], True, "epoch-end", "end-of-epoch work was skipped"),
    "recurrent state not per rank": ("lm_train_ddp.py", [('tuple(s.to(device) for s in ckpt["states"][rank])',
                                                          'tuple(s.to(device) for s in ckpt["states"][0])')],
                                     LM, True, "resume", "a recurrent model's hidden state"),
    "same columns on every rank": ("lm_train_ddp.py", [("train_data[:, rank * args.batch_size:(rank + 1) * "
                                                        "args.batch_size]", "train_data[:, :args.batch_size]")],
                                   LM, False, "data", "fed the same inputs"),
}


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("trap", list(TRAPS))
def test_each_trap_fails_its_check_with_its_own_message(trap, tmp_path):
    base, changes, args, resumes, name, words = TRAPS[trap]
    script = _trap(tmp_path, base, changes)
    hangs = name == "lockstep"  # the ranks wait for each other until the check stops them
    report = check.check(script, args, steps=40 if resumes else 25, resumes=resumes, timeout=10 if hangs else 60,
                         quiet=True)
    failed = [v for v in report.verdicts if v.status == "FAIL"]
    assert failed and failed[0].name == name and words in failed[0].evidence, "\n".join(report.lines())
    others = [v.name for v in failed if v.name not in (name, "exit", "lockstep", "gradients", "run")]
    assert not others, "\n".join(report.lines())  # one trap: one failure (and what follows from it)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_crash_on_one_rank_names_the_rank_and_quotes_its_last_lines(tmp_path):
    script = _trap(tmp_path, "train_ddp.py", [("            step += 1\n", "            step += 1\n"
                                               "            if rank == 1 and step == 3:\n"
                                               "                raise RuntimeError('disk full on rank 1')\n")])
    report = check.check(script, FIRST, steps=20, quiet=True)
    assert report.verdicts[0].line().startswith("FAIL  run         rank 1 crashed at step 3 (train_ddp.py:")
    assert "RuntimeError: disk full on rank 1" in report.verdicts[0].evidence
    assert any("|" in line and "RuntimeError: disk full on rank 1" in line for line in report.notes), report.lines()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_script_that_never_trains_is_stopped_at_the_time_limit(tmp_path):
    script = _trap(tmp_path, "train_ddp.py", [("    loss_fn = nn.CrossEntropyLoss()\n",
                                               "    loss_fn = nn.CrossEntropyLoss()\n    import time\n"
                                               "    time.sleep(600)\n")])
    report = check.check(script, FIRST, steps=20, timeout=10, quiet=True)
    (verdict,) = report.verdicts
    assert verdict.status == "FAIL" and "no rank reached a training forward pass within 10 s" in verdict.evidence
    assert not _alive(script.name), "the check left a process of the script behind"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_script_that_asks_for_cuda_gets_the_chapters_device_line(capsys):
    assert check.main(["--no-resume", "--quiet", "--", str(EXAMPLES / "train_ddp.py"), "--device", "cuda"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("check-script: error: rank ") and "asks for CUDA" in line
    assert 'torch.device("cuda" if torch.cuda.is_available() else "cpu")' in line


def _alive(name: str) -> bool:
    import psutil

    return any(name in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])
               if p.pid != os.getpid())
