"""The reader's own script, scaled out (chapter 16): the examples in ``examples/your_script``
read as files, each distributed version as its changes from the single-GPU script.

The examples import nothing from ``guide_utils`` (a reader copies them whole); this module is
how the chapter and the tests look at them, so that neither pastes a copy that could drift:

* :func:`changes` sorts every changed line of a version into one of the :data:`IDEAS` the
  chapters proved (a line inside a changed block belongs to the block's idea; any other line
  to the first idea whose pattern it matches), and :func:`show` renders one idea as a diff
  per version, computed from the files at the time of the call;
* :func:`count` is the number of changed *code* lines of a version (blank lines, comments
  and docstrings left out), which :data:`LINE_BUDGET` bounds (the chapter and the tests
  assert it);
* :func:`printed_lrs` and :func:`printed_digests` read what a run prints, and
  :func:`expected_lr` is the schedule it must follow: ``core.schedules.lr_at`` with the
  linear rule's peak and a gradual warmup from the one-GPU rate (the thesis's Appendix 13).

>>> [round(expected_lr(s, lr=0.05, workers=2, steps_per_epoch=8, warmup_epochs=1, milestones=(1,)), 4)
...  for s in (0, 4, 8)]  # the one-GPU rate, halfway to twice it, the peak after a tenfold drop
[0.05, 0.075, 0.01]
>>> sorted(VERSIONS)[:3]
['imagenet_train_ddp.py', 'imagenet_train_horovod.py', 'keras_train_horovod.py']

Besides the first script, two more in the shapes real projects have, each made distributed by
the chapter's checklist (:data:`SHAPES`): ``mnist_train.py`` (train() and test() taking the
model, a settings dict, Adadelta, StepLR per epoch, --dry-run) and ``imagenet_train.py``
(validation, a best-accuracy checkpoint, AverageMeter-like progress).
"""

from __future__ import annotations

import difflib
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..core.paths import repo_path
from ..core.scaling import scaled_lr
from ..core.schedules import lr_at

FOLDER = ("examples", "your_script")
# Each distributed version and the single-GPU script it is a diff of.
VERSIONS = {"train_horovod.py": "train.py", "train_ddp.py": "train.py",
            "keras_train_horovod.py": "keras_train.py",
            "mnist_train_ddp.py": "mnist_train.py", "mnist_train_horovod.py": "mnist_train.py",
            "imagenet_train_ddp.py": "imagenet_train.py", "imagenet_train_horovod.py": "imagenet_train.py",
            "lm_train_ddp.py": "lm_train.py", "lm_train_horovod.py": "lm_train.py"}
LABELS = {"train_horovod.py": "PyTorch + Horovod", "train_ddp.py": "PyTorch DDP (torchrun or srun)",
          "keras_train_horovod.py": "Keras + Horovod", "mnist_train_ddp.py": "MNIST-shaped, DDP",
          "mnist_train_horovod.py": "MNIST-shaped, Horovod", "imagenet_train_ddp.py": "ImageNet-shaped, DDP",
          "imagenet_train_horovod.py": "ImageNet-shaped, Horovod", "lm_train_ddp.py": "language model, DDP",
          "lm_train_horovod.py": "language model, Horovod"}
FIRST = ("train_horovod.py", "train_ddp.py", "keras_train_horovod.py")  # the chapter's first script's
SHAPES = ("mnist_train_ddp.py", "mnist_train_horovod.py", "imagenet_train_ddp.py", "imagenet_train_horovod.py")
LM = ("lm_train_ddp.py", "lm_train_horovod.py")  # the word-language-model shape: no DataLoader
# The functions of each single-GPU script that hold its loop, which the versions may change;
# everything else it defines (data, model, digest, checkpoint format) they keep line for line.
LOOP = {"train.py": ("main", "parse_args"), "keras_train.py": ("main", "parse_args"),
        "mnist_train.py": ("main", "train", "test"), "imagenet_train.py": ("main", "train", "validate"),
        "lm_train.py": ("main", "parse_args", "train", "evaluate")}
# Changed code lines a version may have: what the chapter promises and the tests hold. The
# shapes that had no resumable checkpoint or step counter (mnist_train.py) add one too.
LINE_BUDGET = 100
WIDTH = 100  # characters of a line in the book's content column


@dataclass(frozen=True)
class Idea:
    key: str
    title: str
    pattern: str  # a regular expression that finds the idea's lines


# A line that no new block encloses takes the first idea, in this order, whose pattern it matches.
IDEAS = (
    # The language-model shape's own (lm_train_*.py): the other versions have no such lines.
    Idea("update", "an update written by hand: the gradients averaged, then clipped",
         r"synchronize|clip_grad|param_groups\[0\]\[\"lr\"\] = |optim\.SGD\(model\.parameters\(\), lr=args\.lr\)"
         r"|the update see|^\s*optimizer\.(zero_grad|step)\(\)$|run\[\"warmup\"\]"),
    Idea("state", "state carried from batch to batch: each rank's, in the checkpoint",
         r"run\.pop\(\"state\"|\(state\)  #"),
    Idea("plateau", "a schedule on the validation loss: one loss that every rank shares",
         r"\[\"best\"\]|/= 4|float64"),
    Idea("requeue", "stop together on Slurm's warning, save, exit 75, resume",
         r"\bsignal\b|\bstop\b|stop_requested|check_stop|stop_training|SystemExit|barrier|\"saved\""
         r"|def train\(|train\(.*\brun\)|% 10 == 0"),
    Idea("rank0", "print and checkpoint on rank 0", r"rank == 0|rank \{rank\}|rank\(\) == 0|\[\"rank\"\] == 0"),
    Idea("checkpoint", "a resumable checkpoint: the unwrapped model, the position, the RNG",
         r"save_checkpoint|\bsave\b|rng|torch\.load|isfile|os\.path\.exists|load_state_dict|run\[\"step\"\]"
         r"|\bbest_acc1\b|\brun = |import os\b|\"--checkpoint\"|steps = len"),
    Idea("launch", "start the processes and find each other",
         r"import horovod|torch\.distributed as dist|hvd\.init|init_process_group|destroy_process_group"
         r"|rank, size|RANK|SLURM_|MASTER_|scontrol|subprocess"),
    Idea("scale", "the linear scaling rule", r"args\.lr \* size|linear scaling|size\*\*0\.5|square-root|lr=peak"),
    Idea("warmup", "gradual warmup from the one-GPU rate", r"warmup|lr_factor|scheduler\.step\(\)"),
    Idea("device", "one GPU per process", r"set_device|GPU|gpus|accelerator|one device per process"),
    Idea("gradients", "average the gradients, start from rank 0's weights",
         r"DistributedOptimizer|DistributedDataParallel|ddp_model|broadcast|BroadcastGlobal"),
    Idea("data", "a shard per rank, reshuffled every epoch",
         r"DistributedSampler|sampler|SkippingSampler|set_epoch|rank::size|// size|islice|\bdone\b|Generator"
         r"|import itertools|args\.batch_size \* size|\[:, rank \* args\.batch_size"),
    Idea("evaluate", "evaluation on every rank, each its share, summed", r"val_|test_loader|Subset|Acc@1|acc1"
         r"|Accuracy|sums|correct|reduction=\"sum\""),
    Idea("metrics", "metrics summed or averaged over the ranks", r"totals|MetricAverage"),
)
# The six steps Horovod's documentation asks of a training script (initialise, pin a GPU per
# process, scale the learning rate, wrap the optimizer, broadcast the initial state, save
# checkpoints on rank 0 only), as ideas here (rank0 also guards the prints).
HOROVOD_LIST = ("launch", "device", "scale", "gradients", "rank0")


@dataclass(frozen=True)
class Line:
    sign: str  # "+" (in the distributed version) or "-" (only in the single-GPU script)
    number: int  # 1-based, in the file the line is from
    text: str
    idea: str | None
    code: bool  # False: blank, a comment or part of the module docstring
    block: int  # index of the changed block (difflib opcode) the line belongs to


def path(name: str) -> Path:
    return repo_path(*FOLDER, name)


def _code_lines(source: str) -> set[int]:
    """1-based numbers of the lines that hold code: not blank, not only a comment, not the
    module's docstring."""
    code: set[int] = set()
    first = True
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                        tokenize.ENCODING, tokenize.ENDMARKER):
            continue
        if first and tok.type == tokenize.STRING:  # the module docstring
            first = False
            continue
        first = False
        code.update(range(tok.start[0], tok.end[0] + 1))
    return code


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())


def _own_idea(text: str) -> str | None:
    return next((idea.key for idea in IDEAS if re.search(idea.pattern, text)), None)


def _new_lines(old: list[str], new: list[str], opcodes: list[tuple]) -> set[int]:
    """Changed lines of the new file (0-based) that are new, not an edit of a line of the
    single-GPU script (no line of their block is at least 60 % like them)."""
    fresh = set()
    for _, i1, i2, j1, j2 in opcodes:
        for j in range(j1, j2):
            like = max((difflib.SequenceMatcher(None, old[i].strip(), new[j].strip()).ratio() for i in range(i1, i2)),
                       default=0.0)
            if like < 0.6:
                fresh.add(j)
    return fresh


def _classify_new(new: list[str], changed: set[int], fresh: set[int], code: set[int]) -> dict[int, str | None]:
    """The idea of each changed line of the new file (0-based index -> key; None: a blank
    line or part of the docstring). A line inside a new block (a new ``if``, ``def``...)
    has the idea of the outermost new block around it; any other line the first idea whose
    pattern it matches, or, continuing a statement, that statement's."""
    ideas: dict[int, str | None] = {}
    for i in sorted(j for j in changed if j + 1 in code):
        level, owner = _indent(new[i]), None
        for j in range(i - 1, -1, -1):  # the enclosing statements, innermost first
            if (j + 1) in code and _indent(new[j]) < level:
                level = _indent(new[j])
                if new[j].split("#")[0].rstrip().endswith(":"):  # a block opener: new, or the end
                    if j not in fresh:
                        break
                    owner = j
        ideas[i] = ideas[owner] if owner is not None else _own_idea(new[i])
        previous = [j for j in ideas if j < i and ideas[j] is not None]
        if ideas[i] is None and previous and _indent(new[i]) > _indent(new[previous[-1]]):
            ideas[i] = ideas[previous[-1]]  # a continuation line: the statement it continues
    for i in sorted(changed):  # a comment line: the code line it introduces
        if i not in ideas:
            after = [j for j in sorted(ideas) if j > i]
            ideas[i] = ideas[after[0]] if after and new[i].lstrip().startswith("#") else None
    return ideas


def _sources(name: str) -> tuple[list[str], list[str], list[tuple]]:
    """(single-GPU lines, distributed lines, the changed blocks as difflib opcodes)."""
    old, new = path(VERSIONS[name]).read_text().splitlines(), path(name).read_text().splitlines()
    opcodes = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    return old, new, [op for op in opcodes if op[0] != "equal"]


def changes(name: str) -> list[Line]:
    """Every changed line of version ``name`` against its single-GPU script, with its idea.
    A line only in the single-GPU script takes the idea of the most similar new line of its
    block (the line that replaced it), or where none has one, the idea its own text names."""
    old, new, opcodes = _sources(name)
    old_code, new_code = _code_lines("\n".join(old)), _code_lines("\n".join(new))
    changed = {j for _, _, _, j1, j2 in opcodes for j in range(j1, j2)}
    ideas = _classify_new(new, changed, _new_lines(old, new, opcodes), new_code)
    lines: list[Line] = []
    for block, (_, i1, i2, j1, j2) in enumerate(opcodes):
        for i in range(i1, i2):
            kept = (i + 1) in old_code or old[i].lstrip().startswith("#")
            twins = [j for j in range(j1, j2) if ideas.get(j) is not None]
            twin = max(twins, key=lambda j: difflib.SequenceMatcher(None, old[i], new[j]).ratio(), default=None)
            # a line deleted or moved without a successor takes the idea its own text names
            idea = ideas[twin] if twin is not None else _own_idea(old[i])
            lines.append(Line("-", i + 1, old[i], idea if kept else None, (i + 1) in old_code, block))
        lines += [Line("+", j + 1, new[j], ideas.get(j), (j + 1) in new_code, block) for j in range(j1, j2)]
    return lines


def count(name: str, ideas: Sequence[str] | None = None) -> int:
    """Changed code lines of version ``name``: lines of code it has that its single-GPU
    script does not (only those of ``ideas``, if given)."""
    return sum(1 for line in changes(name) if line.sign == "+" and line.code and (ideas is None or line.idea in ideas))


def unclaimed(name: str) -> list[str]:
    """Changed code lines that no idea claims: the chapter explains every line, so none may be."""
    return [line.text for line in changes(name) if line.code and line.idea is None]


def counts(names: Sequence[str] = FIRST):
    """A table of changed code lines: one row per idea, one column per version, and the total."""
    import pandas as pd

    added = {name: [line.idea for line in changes(name) if line.sign == "+" and line.code] for name in names}
    table = pd.DataFrame({LABELS[name]: {idea.key: added[name].count(idea.key) for idea in IDEAS} for name in names})
    table.loc["total"] = table.sum()
    return table


def _runs(lines: list[Line], new: list[str]) -> list[list[Line]]:
    """``lines`` (one block's, in order) cut where a line of the new file between two of
    them is left out: each run reads as consecutive code."""
    runs: list[list[Line]] = []
    last = None
    for line in lines:
        if line.sign == "+" and last is not None and any(new[j].strip() for j in range(last, line.number - 1)):
            runs.append([])
        if not runs:
            runs.append([])
        runs[-1].append(line)
        last = line.number if line.sign == "+" else last
    return runs


def diff_text(name: str, idea: str | Sequence[str] | None = None) -> str:
    """The changes of version ``name`` as a unified diff: each run of changed lines with the
    lines next to it when they are unchanged, under a header that names its line and, as
    git's does, the statement it is in; with ``idea`` (one, or several), only that idea's
    lines (comments included, blank lines left out)."""
    _, new, opcodes = _sources(name)
    changed = {j for _, _, _, j1, j2 in opcodes for j in range(j1, j2)}
    lines = changes(name)
    wanted = (idea,) if isinstance(idea, str) else idea
    out = [f"--- {VERSIONS[name]}", f"+++ {name}"]
    for block, (_, _, _, j1, _) in enumerate(opcodes):
        mine = [line for line in lines if line.block == block
                and (wanted is None or (line.idea in wanted and line.text.strip()))]
        for run in _runs(mine, new) if wanted else [mine] if mine else []:
            plus = [line.number - 1 for line in run if line.sign == "+"] or [j1]
            before = [j for j in range(plus[0] - 1, -1, -1) if new[j].strip()][:1]
            after = [j for j in range(plus[-1] + 1, len(new)) if new[j].strip()][:1]
            level = _indent(new[plus[0]])
            inside = [j for j in range(plus[0] - 1, -1, -1) if new[j].strip() and _indent(new[j]) < level][:1]
            header = f"@@ {name} line {plus[0] + 1} @@"
            for j in inside:  # the enclosing statement, without its comment, cut to the column
                header = f"{header} {new[j].split('  #')[0].strip()}"[:WIDTH]
            out.append(header)
            out += [f" {new[j]}" for j in before if j not in changed] + [f"{line.sign}{line.text}" for line in run]
            out += [f" {new[j]}" for j in after if j not in changed]
    return "\n".join(out)


def show(idea: str | Sequence[str] | None = None, names: Sequence[str] = FIRST):
    """The changes of ``idea`` (one or several; None: all of them) in each version, as Markdown diff blocks
    for a notebook (``IPython.display``); a version without such a change says so."""
    from IPython.display import Markdown

    parts = []
    for name in names:
        text = diff_text(name, idea)
        body = f"```diff\n{text}\n```" if "\n@@" in text else "(no change for this)"
        parts.append(f"**{LABELS[name]}**, `{name}`:\n\n{body}")
    return Markdown("\n\n".join(parts))




def printed_lrs(output: str) -> dict[int, float]:
    """``step N lr X`` lines (rank 0's) as {step: learning rate}."""
    return {int(s): float(lr) for s, lr in re.findall(r"\bstep (\d+) lr (\S+)", output)}


def printed_digests(output: str) -> dict[int, str]:
    """``rank R weights DIGEST`` lines as {rank: digest}."""
    return {int(r): d for r, d in re.findall(r"rank (\d+) weights ([0-9a-f]{16})", output)}


def expected_lr(step: int, *, lr: float, workers: int, steps_per_epoch: int, warmup_epochs: int,
                milestones: Sequence[int] = (30, 60, 80), gamma: float = 0.1, rule: str = "linear") -> float:
    """The learning rate at ``step`` of an example run: the peak the scaling ``rule`` gives
    (``lr`` times the workers, or their square root), reached by a gradual warmup from ``lr``
    over ``warmup_epochs``, then ``gamma`` at each of ``milestones`` (a per-epoch decay is a
    milestone at every epoch after the warmup); ``lr_at`` at the float epoch
    ``step / steps_per_epoch``."""
    peak = scaled_lr(lr, 1, workers, rule=rule)
    return lr_at(step / steps_per_epoch, peak_lr=peak, warmup="gradual", warmup_epochs=warmup_epochs,
                 warmup_start_lr=lr, milestones=milestones, gamma=gamma)
