"""Every number the book's prose pages state is computed, cited or structural (issue 58).

The chapters are notebooks: their numbers are glued from the cells that compute them. The
pages of ``book/*.md`` are prose, and a number typed there is a claim nobody recomputes. So
this test reads each page's digits (code blocks and code spans left out: what a reader
types) and fails on any number that is none of:

* **computed**: glued (``{glue:text}`key``` on the page, or ``{glue:text}`../notebooks/NN.ipynb::key```
  from the chapter that computes it and guards it with an assert);
* **cited**: in a sentence, list item or table row that carries a ``{cite}`` (a table cell
  also when its column's header cites), because it is a source's number;
* **structural**, by one of the narrow kinds in :data:`KINDS`, each with its reason;
* **in the ledger**: :data:`LEDGER` lists, page by page, the few phrases left (the arithmetic
  of the page's own example, a setting of the guide's code, a definition's constant), each
  with its reason and a check that recomputes it or reads it from the code, so an entry that
  stops holding fails here.

Cheap: it reads text and imports a few modules for the ledger's checks; it builds nothing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

ROLE = re.compile(r"\{[\w:-]+\}`[^`]*`")  # {cite}`k`, {doc}`4 <...>`, {glue:text}`k:.1f`, {term}`x`, {ref}`x`
CITE = re.compile(r"\{cite(?::\w+)?\}`")
CODE = re.compile(r"``.+?``|`[^`\n]+`")
LINK = re.compile(r"\]\([^)]*\)|<?https?://[^\s)>]+>?|<!--.*?-->", re.S)
MATH = re.compile(r"\$[^$\n]+\$")
# A number, a range (1-3), or a factor written x1.02; not the digits of a name (P100, float32).
NUMBER = re.compile(r"(?:(?<![\w.])|(?<=\bx))\d+(?:,\d{3})*(?:\.\d+)*(?:\s?[-–]\s?\d+(?:\.\d+)*)*")
ABBREVIATION = re.compile(r"\b(e\.g|i\.e|et al|exp|cf|vs|etc|approx|no)\.")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"(*{`\[])")

PRODUCTS = (r"Slurm|PyTorch|torch|torchvision|CUDA|cuDNN|Python|Horovod|TensorFlow|Keras|JupyterHub|NCCL|"
            r"OpenMPI|Open MPI|Debian|Ubuntu|ipyparallel|batchspawner|configurable-http-proxy|papermill|"
            r"Apptainer|ROCm|version|versions|release|releases")


@dataclass(frozen=True)
class Kind:
    name: str
    reason: str
    pattern: re.Pattern  # a match that covers the number's span makes it this kind


# The structural kinds, narrow on purpose: each says why such a number is no result.
KINDS = [
    Kind("name", "part of a name: a GPU (P100), a model (ResNet-50), a metric (top-1), a data type (float32)",
         re.compile(r"(?:[A-Za-z]{2,}|[A-WYZa-wyz])[-_]?\d+(?:\.\d+)*[A-Za-z]*")),  # not x1.02: a factor
    Kind("reference", "names a part of the book or of a source (chapter 4, Table 10, exp. 5, section 5.1), not a "
         "quantity", re.compile(r"\b(?:chapters?|tables?|figures?|experiments?|exp\.|sections?|appendix|appendices|"
                                r"issue|items?)\s+\d+(?:\.\d+)*(?:\s*(?:,|and|to|or|-|–)\s*\d+(?:\.\d+)*)*", re.I)),
    Kind("version", "a release's name (Slurm 22.05, PyTorch 2.14.1), not a quantity",
         re.compile(rf"(?:\b(?:{PRODUCTS})\)?\s+\(?v?\d+(?:\.(?:\d+|x))*|\b\d+\.\d+\.\d+\b)")),
    Kind("identifier", "an identifier, not a quantity: a rank, an exit status",
         re.compile(r"\b(?:rank|exit code|exit status|status)\s+\d+\b")),
    Kind("notation", "a number of dimensions written as a word (1-D), not a quantity", re.compile(r"\b[1-4]-D\b")),
    Kind("point", "names a point of a study by its scaling factor (k = 32), as a chapter is named by its number",
         re.compile(r"\bk\s*=\s*\d+(?:\s*(?:,|and|to|or)\s*\d+)*")),
]

# A table column's header that says what its numbers are: versions of a product, or the
# numbers of the rows' chapters ("#").
COLUMNS = {"slurm": "version", "pytorch": "version", "python": "version", "#": "reference"}


def _arrays_per_worker_batches():
    sbatch = (REPO / "slurm_examples" / "04_naive_scaling.sbatch").read_text()
    return "PER_WORKER_BATCHES=(32 64 128)" in sbatch


def _per_worker_batches_of_07():
    return "PER_WORKER_BATCHES=(32 128)" in (REPO / "slurm_examples" / "07_per_worker_batch_size.sbatch").read_text()


def _resnet50_parameters():
    from guide_utils.perf.model import PARAMETERS

    n = PARAMETERS["resnet50"]
    return round(n / 1e6, 1) == 25.6 and abs(4 * n / 1e6 - 100) < 5  # "about 100 MB" of float32


def _imagenet_counts():
    from guide_utils.data.imagenet import OFFICIAL

    return OFFICIAL == (1_281_167, 50_000) and round(OFFICIAL[0] / 1e6, 1) == 1.3


def _imagenet_classes():
    from guide_utils.data.imagenet import TRAIN_FIX

    return "1000 class tars" in TRAIN_FIX


def _engines_defaults():
    import inspect

    from guide_utils.cluster.interactive import engines

    sig = inspect.signature(engines.EngineCluster.__init__).parameters
    interval, misses = sig["watch"].default
    return sig["walltime"].default == "01:00:00" and interval * misses == 15


def _submit_spreads_workers():
    # submit.sh: ceil(N / tasks per node) nodes, the same number of tasks on each
    def layout(workers, per_node):
        nodes = math.ceil(workers / per_node)
        return nodes, workers // nodes

    return layout(32, 4) == (8, 4) and layout(32, 8) == (4, 8) and layout(12, 8) == (2, 6)


def _threads_per_task_of_the_profiles():
    """The CPUs per task of the three site profiles, as threads of physical cores: Perlmutter
    counts two hardware threads a core, LUMI and Puhti count cores."""
    def cpus(site):
        text = (REPO / "slurm_examples" / "sites" / f"{site}.sh").read_text()
        return int(re.search(r"^GUIDE_CPUS_PER_TASK=(\d+)", text, re.M).group(1))

    return (cpus("perlmutter-like") // 2, cpus("lumi-like"), cpus("puhti-like")) == (16, 7, 10)


def _largest_global_batch():
    from guide_utils.core.config import make_config
    from guide_utils.studies import large_batch

    return max(large_batch.KS) * make_config("smoke").per_worker_batch == 8192


def _sweep_settings():
    """The quality sweep's settings (chapters 4-7), as the methods page states them."""
    from guide_utils.studies import sweep

    s = sweep.SETTINGS
    return ((s["mnist1d_samples"], s["epochs"], s["milestones"], s["base_batch"], s["base_lr"], s["loader_workers"])
            == (20000, 20, (10, 15), 32, 0.05, 0) and sweep.BASE_BATCH == 32 and max(sweep.KS) == 32
            and sweep.METHODS["linear+warmup"]["warmup_start_batch"] == 32
            and (s["milestones"][0] / s["epochs"], s["milestones"][1] / s["epochs"]) == (0.5, 0.75))


def _sweep_largest_batch_and_rates():
    """k = 32 x batch 32 = 1,024, and the peak rates the recorded sweep trained there: the base
    rate for the baseline and naive scaling, 32 times it for the linear rule."""
    from guide_utils.studies import sweep

    table = sweep.recorded()
    peak = table.groupby(["k", "method"])["peak_lr"].agg(["min", "max"])
    one = {key: float(row["min"]) for key, row in peak.iterrows() if row["min"] == row["max"]}
    return (max(sweep.KS) * sweep.BASE_BATCH == 1024 and len(one) == len(peak)
            and one[(1, "baseline")] == one[(32, "naive")] == 0.05
            and math.isclose(one[(32, "linear")], 1.6) and math.isclose(one[(32, "linear+warmup")], 1.6))


def _mnist1d_split():
    from mnist1d.data import get_dataset_args

    return get_dataset_args().train_split == 0.8


def _digits_steps():
    from guide_utils.data.arrays import digits_split

    train = len(digits_split()[2])  # the loader drops the last incomplete batch
    return (train // 512, train // 1024) == (2, 1)


def _mnist1d_cnn_layers():
    from torch import nn

    from guide_utils.engine.models import mnist1d_cnn

    convs = [m for m in mnist1d_cnn(10).modules() if isinstance(m, nn.Conv1d)]
    return [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [(32, (5,), (1,)), (32, (5,), (2,)),
                                                                          (32, (5,), (2,))]


def _train_defaults():
    from guide_utils.core.config import TrainConfig

    defaults = {f.name: f.default for f in fields(TrainConfig)}
    return (defaults["momentum"], defaults["weight_decay"], defaults["gamma"]) == (0.9, 1e-4, 0.1)


def _smoke_profile():
    from guide_utils.core.config import make_config

    c = make_config("smoke")
    return ((c.mnist1d_samples, c.epochs, c.per_worker_batch, c.milestones, c.warmup_epochs, c.loader_workers)
            == (4000, 4, 32, (2, 3), 1, 0))


def _throughput_smoke():
    from torch import nn

    from guide_utils.engine.models import small_resnet
    from guide_utils.studies.experiment_plans import SMOKE_THROUGHPUT as s

    channels = {m.out_channels for m in small_resnet(10).modules() if isinstance(m, nn.Conv2d)}
    return channels == {16, 32, 64} and (s["image_size"], s["max_steps_per_epoch"], s["throughput_warmup_iters"]) == (
        32, 20, 5)


# (page, phrase, reason, check): the numbers left after the kinds above, each recomputed or
# read from the code by its check.
LEDGER = [
    ("intro.md", "32 workers with 128 images each take optimizer steps on 4096 images",
     "the arithmetic of the page's own example", lambda: 32 * 128 == 4096),
    ("intro.md", "up to a global batch of 8192", "chapter 13's largest global batch, a setting of its study",
     _largest_global_batch),
    ("glossary.md", "A job of eight GPUs for two hours costs 16", "the definition's own example: 8 x 2",
     lambda: 8 * 2 == 16),
    ("glossary.md", "100 % when N workers do the work of N single workers", "the definition: N / N",
     lambda: True),
    ("glossary.md", "100 % minus the accuracy", "the definition: error = 100 % - accuracy", lambda: True),
    ("day_one.md", "(per-worker batches 32, 64 and 128)", "the shipped arrays, read from the sbatch file",
     _arrays_per_worker_batches),
    ("day_one.md", "three such tasks for 40 hours each are 960", "the arithmetic of the page's example: 3 x 8 x 40",
     lambda: 3 * 8 * 40 == 960),
    ("day_one.md", "ResNet-50 has 25.6 million parameters, about 100 MB", "the model's parameter count in the code "
     "(torchvision's), times 4 bytes", _resnet50_parameters),
    ("day_one.md", "1.3 million JPEG files", "ImageNet's training images, as prepare-imagenet checks them",
     _imagenet_counts),
    ("slurm.md", "checks the counts (1,281,167 and 50,000 images", "the counts prepare-imagenet checks, in the code",
     _imagenet_counts),
    ("slurm.md", "holds 1000 class tars", "ImageNet's classes, as prepare-imagenet expects them", _imagenet_classes),
    ("slurm.md", "the thesis's 32 GPUs are 8 nodes of 4 on Taito and 4 nodes of 8 on the newer layout, and 12\n"
     "workers on 8-GPU nodes are 2 nodes of 6", "submit.sh's rule worked through", _submit_spreads_workers),
    ("slurm.md", "16 on Perlmutter, where the job finds that Slurm's CPUs are hardware threads "
     "(`scontrol show node`: `CPUTot` is sockets times cores times threads), 7 on LUMI and 10 on Puhti",
     "the site profiles' CPUs per task in physical cores, read from the profiles", _threads_per_task_of_the_profiles),
    ("slurm.md", "compares per-worker batches 32 and 128", "the shipped array, read from the sbatch file",
     _per_worker_batches_of_07),
    ("slurm.md", "training to epochs 10, 20, ..., 90", "the example's arithmetic: 9 links of 10 epochs",
     lambda: [10 * i for i in range(1, 10)][-1] == 90),
    ("jupyterhub.md", "its `walltime` (1 hour by default)", "the default of EngineCluster, read from the code",
     _engines_defaults),
    ("jupyterhub.md", "stopped answering for 15 s", "the controller watch's default (5 s x 3), read from the code",
     _engines_defaults),
    ("methods.md", "80 % of the samples are for training", "MNIST-1D's train split, read from the package",
     _mnist1d_split),
    ("methods.md", "k = 32 workers of batch 32, a global batch of 1,024", "the sweep's largest k times its base batch",
     _sweep_largest_batch_and_rates),
    ("methods.md", "batch 1,024", "the sweep's largest global batch (k = 32 x 32)", _sweep_largest_batch_and_rates),
    ("methods.md", "(0.05)", "the peak rate the recorded sweep trained the baseline and naive scaling at",
     _sweep_largest_batch_and_rates),
    ("methods.md", "(1.6)", "the peak rate the recorded sweep trained the linear rule at, k = 32",
     _sweep_largest_batch_and_rates),
    ("methods.md", "at global batches of 512 and 1,024 they give two steps per epoch and one",
     "scikit-learn's digits as the engine splits them, divided by the batch", _digits_steps),
    ("methods.md", "three 1-D convolutions of 32 channels (kernel 5, the second and third with stride 2)",
     "the model, read from the code", _mnist1d_cnn_layers),
    ("methods.md", "momentum 0.9 and weight decay 10⁻⁴, and the learning rate divided by 10 at each milestone",
     "TrainConfig's defaults, read from the code", _train_defaults),
    ("methods.md", "training samples in batches of 32", "the sweep's base batch, a setting", _sweep_settings),
    ("methods.md", "20,000 signals", "the sweep's samples, a setting", _sweep_settings),
    ("methods.md", "20 epochs", "the sweep's epochs, a setting", _sweep_settings),
    ("methods.md", "epochs 10 and 15", "the sweep's milestones, a setting", _sweep_settings),
    ("methods.md", "50 % and 75 % of training", "the milestones over the epochs", _sweep_settings),
    ("methods.md", "batch 32", "the sweep's base batch and warmup start batch, settings", _sweep_settings),
    ("methods.md", "k x 32", "k times the base batch, a setting", _sweep_settings),
    ("methods.md", "0.05 at batch 32", "the sweep's base learning rate, a setting", _sweep_settings),
    ("methods.md", "4,000 MNIST-1D samples, 4 epochs, per-worker batch 32, milestones at epochs 2 and 3",
     "the smoke profile, read from the code", _smoke_profile),
    ("methods.md", "a ResNet with 16, 32 and 64 channels, on synthetic 32x32 images for 20 iterations, and leave the "
     "first 5 out of the timing", "the throughput experiments' smoke settings and model, read from the code",
     _throughput_smoke),
]


@dataclass(frozen=True)
class Number:
    page: str
    line: int
    text: str
    unit: str
    kind: str | None  # None: neither computed, cited, structural nor in the ledger


def _blocks(text: str):
    """Blocks of prose lines ``[(line number, line), ...]``, split at blank lines; code blocks
    left out, the content of a directive block (```` ```{glossary} ````) kept."""
    block, fence = [], None
    for i, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if fence:
            if stripped.startswith("```"):
                fence = None
                if block:
                    yield block
                block = []
            elif fence == "prose" and not re.match(r":[\w-]+:", stripped) and stripped:
                block.append((i, line))
            elif fence == "prose" and block and not stripped:
                yield block
                block = []
            continue
        if stripped.startswith("```"):
            if block:
                yield block
            block, fence = [], "prose" if stripped[3:].startswith("{") else "code"
        elif not stripped or re.fullmatch(r"\(\S+\)=", stripped):
            if block:
                yield block
            block = []
        else:
            block.append((i, line))
    if block:
        yield block


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def units(text: str):
    """``(line, unit, headers)`` for every sentence, list item's sentence and table row of a
    page's prose; ``headers`` are a table row's column headers (else empty)."""
    for block in _blocks(text):
        if all(line.lstrip().startswith("|") for _, line in block):
            header = _cells(block[0][1])
            yield block[0][0], block[0][1], []
            for i, line in block[1:]:
                if not re.fullmatch(r"[|\s:-]+", line):
                    yield i, line, header
            continue
        items, item = [], []
        for i, line in block:
            if re.match(r"\s*(?:[*-]|\d+\.)\s", line) and item:
                items.append(item)
                item = []
            item.append((i, line))
        items.append(item)
        for item in items:
            joined = "\n".join(line for _, line in item)
            masked = ABBREVIATION.sub(lambda m: m.group(1) + "\0", joined)
            pos = 0
            for part in SENTENCE_END.split(masked):
                offset = masked.index(part, pos)
                pos = offset + len(part)
                yield item[0][0] + masked[:offset].count("\n"), part.replace("\0", "."), []


def _bare(text: str) -> str:
    """What a reader reads as prose: code, roles (glued values, citations, links to pages),
    link targets and math replaced by spaces of the same length, so positions still match."""
    for pattern in (CODE, MATH, ROLE, LINK):
        text = pattern.sub(lambda m: " " * len(m.group(0)), text)
    return text


def _kind(bare: str, match: re.Match, cited: bool) -> str | None:
    if cited:
        return "cited"
    for kind in KINDS:
        for m in kind.pattern.finditer(bare):
            if m.start() <= match.start() and match.end() <= m.end():
                return kind.name
    return None


def _spans(text: str, phrases: list[str]) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for p in phrases for m in re.finditer(re.escape(p), text)]


def numbers(text: str, page: str) -> list[Number]:
    """Every number of a page's prose, with the kind that explains it (None where nothing does)."""
    found = []
    phrases = [" ".join(phrase.split()) for p, phrase, _, _ in LEDGER if p == page]
    for line, unit, header in units(text):
        flat = " ".join(unit.split())
        cells = _cells(flat) if header else [flat]
        for col, cell in enumerate(cells):
            head = header[col] if col < len(header) else ""
            cited = bool(CITE.search(flat) or CITE.search(head))
            bare, ledger = _bare(cell), _spans(cell, phrases)
            for m in NUMBER.finditer(bare):
                kind = _kind(bare, m, cited)
                if kind is None:
                    kind = COLUMNS.get(_bare(head).strip().lower())
                if kind is None and any(a <= m.start() and m.end() <= b for a, b in ledger):
                    kind = "ledger"
                found.append(Number(page, line, m.group(0), flat, kind))
    return found


def book_pages() -> list[Path]:
    from test_book_text import toc_pages

    return [p for p in toc_pages() if p.suffix == ".md"]


def _report(unexplained: list[Number]) -> str:
    lines = [f"  line {n.line}: {n.text!r} in: {n.unit[:160]}" for n in unexplained]
    return (f"{unexplained[0].page}: {len(unexplained)} number(s) neither computed, cited nor structural. Glue a "
            "number about the guide's own runs from the chapter that computes it ({glue:text}`../notebooks/"
            "NN_name.ipynb::key:.2f`, asserted there), cite a source's number in its sentence ({cite}`key`), or "
            "add the phrase to LEDGER in tests/test_book_numbers.py with its reason and a check:\n" + "\n".join(lines))


@pytest.mark.parametrize("page", book_pages(), ids=lambda p: p.name)
def test_every_number_on_the_page_is_computed_cited_or_structural(page):
    unexplained = [n for n in numbers(page.read_text(encoding="utf-8"), page.name) if n.kind is None]
    assert not unexplained, _report(unexplained)


def test_the_ledger_holds_and_every_entry_is_still_on_its_page():
    pages = {p.name: " ".join(p.read_text(encoding="utf-8").split()) for p in book_pages()}
    for page, phrase, reason, check in LEDGER:
        assert " ".join(phrase.split()) in pages[page], f"{page} no longer says {phrase!r}: remove it from LEDGER"
        assert reason and check(), f"{page}: {phrase!r} no longer holds ({reason})"


PLANTED = """# A page

The engine trained at 2565 images/s on one GPU.

The thesis's 32 GPUs reached 74.66 % top-1 {cite}`thesis`. Chapter 12 measured
{glue:text}`h100_engine:.0f` images/s on ResNet-50 in float32 with PyTorch 2.14.1, run as
`--epochs 90`; see Table 10 and exp. 5.

| Slurm | what |
|---|---|
| 22.05 | one run of 17 s |

```bash
python -m guide_utils plan --throughput 128:207.79
```
"""


def test_a_planted_uncited_result_fails_and_the_kinds_pass_what_they_should():
    found = numbers(PLANTED, "planted.md")
    unexplained = [(n.line, n.text) for n in found if n.kind is None]
    assert unexplained == [(3, "2565"), (11, "17")], unexplained  # the result, and the table cell's result
    kinds = {n.text: n.kind for n in found}
    assert kinds["74.66"] == kinds["32"] == "cited"
    assert kinds["12"] == kinds["10"] == kinds["5"] == "reference"
    assert kinds["50"] == "name"  # ResNet-50
    assert kinds["2.14.1"] == kinds["22.05"] == "version"
    assert not {"90", "128", "207.79"} & set(kinds)  # code is not prose
    assert "100" not in kinds  # {glue:text}`h100_engine:.0f`: computed, no digits read from it
    # the report names the page, the line, the number and what to do
    report = _report([n for n in found if n.kind is None])
    assert report.startswith("planted.md: 2 number(s)") and "line 3: '2565'" in report and "{cite}" in report


def test_the_ledger_is_narrow():
    """An entry covers the numbers of its own phrase only: the same number elsewhere on the page
    is still unexplained."""
    found = numbers("A job of eight GPUs for two hours costs 16; another took 16 h.", "glossary.md")
    assert [n.kind for n in found] == ["ledger", None]
    assert [n.kind for n in numbers("At k = 32 the 1-D model took 12 s.", "x.md")] == ["point", "notation", None]
    assert [(n.text, n.kind) for n in numbers("torch.compile gave x1.02 on a P100.", "x.md")] == [("1.02", None)]
