"""The book's text, without building it: the bibliography is complete and clean, every source
is cited with the {cite} role and none in plain text, and glossary terms resolve."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIB = REPO / "book" / "references.bib"
CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")
# "(Goyal et al., 2017)", "Goyal et al. (2017)", "(Sergeev and Del Balso, 2018)": citations typed as text
PLAIN_CITATION = re.compile(r"\b[A-Z][\w-]+ et al\.,? \(?(19|20)\d\d\b"
                            r"|\([A-Z][\w-]+(?: [A-Z][\w-]+)*(?: and [A-Z][\w-]+(?: [A-Z][\w-]+)*)?,? (19|20)\d\d\)")
# Reader-facing fields must not carry notes to ourselves.
INTERNAL = re.compile(r"seed|this guide|of the guide|TODO|FIXME", re.I)
REQUIRED = {"mastersthesis": {"author", "title", "school", "year"},
            "inproceedings": {"author", "title", "booktitle", "year", "doi"},
            "article": {"author", "title", "journal", "year"},
            "techreport": {"author", "title", "institution", "year"},
            "misc": {"author", "title"}}


def toc_pages() -> list[Path]:
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    files = [toc["root"], *(ch["file"] for part in toc["parts"] for ch in part["chapters"])]
    return [p for f in files for p in (REPO / f"{f}.md", REPO / f"{f}.ipynb") if p.exists()]


def prose(path: Path) -> str:
    """A page's reader-facing text: the Markdown file, or a notebook's Markdown cells."""
    if path.suffix == ".md":
        return path.read_text(encoding="utf-8")
    nb = nbformat.read(path, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def entries():
    from pybtex.database import parse_file

    return parse_file(str(BIB)).entries


def test_every_entry_is_complete_and_clean():
    for key, entry in entries().items():
        fields = {k.lower() for k in entry.fields} | ({"author"} if entry.persons.get("author") else set())
        if entry.fields.get("archiveprefix") == "arXiv" and entry.fields.get("eprint"):
            fields |= {"doi"}  # an arXiv identifier finds a paper whose proceedings have no DOI
        missing = REQUIRED[entry.type] - fields
        assert not missing, f"{key}: missing {sorted(missing)}"
        if entry.fields.get("archiveprefix") == "arXiv":
            assert entry.fields.get("eprint") and entry.fields.get("year"), f"{key}: arXiv entries need eprint and year"
        text = " ".join([*entry.fields.values(), *(str(p) for p in entry.persons.get("author", []))])
        assert "\\" not in text, f"{key}: LaTeX escapes render badly in labels; write names in UTF-8"
        for name in ("note", "howpublished"):
            assert not INTERNAL.search(entry.fields.get(name, "")), f"{key}: {name} reads like an internal note"


def test_no_work_is_in_the_bibliography_twice():
    """Two keys for one work print it twice in the references (Sergeev and Del Balso were once
    both ``horovod`` and ``sergeev2018horovod``): one entry per eprint, DOI and title."""
    seen = {}
    for key, entry in entries().items():
        for name in ("eprint", "doi", "title"):
            value = entry.fields.get(name)
            if value:
                ident = (name, re.sub(r"[{}\s]", "", value).lower())
                assert ident not in seen, f"{key} and {seen[ident]} have the same {name}: merge them"
                seen[ident] = key


def test_the_entries_the_book_needs():
    e = entries()
    assert [str(p) for p in e["summit"].persons["author"]][0] == "Yin, Junqi"
    assert "DLS" in e["summit"].fields["booktitle"] and e["summit"].fields["year"] == "2019"
    assert e["osu"].fields["doi"] == "10.1145/3293883.3302260" and "PPoPP" in e["osu"].fields["booktitle"]
    assert [str(p) for p in e["horovod"].persons["author"]] == ["Sergeev, Alexander", "Del Balso, Mike"]
    assert "Dollár, Piotr" in [str(p) for p in e["goyal2017"].persons["author"]]


def test_every_entry_is_cited_with_the_cite_role():
    cited = {key.strip() for page in toc_pages() for keys in CITE.findall(prose(page)) for key in keys.split(",")}
    assert cited <= set(entries()), f"cited but not in references.bib: {sorted(cited - set(entries()))}"
    assert set(entries()) <= cited, f"in references.bib but never cited: {sorted(set(entries()) - cited)}"


@pytest.mark.parametrize("page", toc_pages(), ids=lambda p: p.name)
def test_no_citation_is_typed_as_plain_text(page):
    text = CITE.sub("", prose(page))
    found = [m.group(0) for m in PLAIN_CITATION.finditer(text)]
    assert not found, f"{page.name}: cite with {{cite}}`key` instead of {found}"


def test_the_plain_text_pattern_catches_what_it_should():
    assert PLAIN_CITATION.search("a short warmup (Goyal et al., 2017) recovers")
    assert PLAIN_CITATION.search("as shown (Sergeev and Del Balso, 2018)")
    assert not PLAIN_CITATION.search("Goyal et al. argued that {cite}`goyal2017`")


TERM = re.compile(r"\{term\}`(?:[^`<]*<([^>`]+)>|([^`]+))`")


def glossary_entries() -> list[list[str]]:
    """The glossary's entries, each the list of terms it defines (several lines of terms, then
    an indented definition)."""
    text = (REPO / "book" / "glossary.md").read_text(encoding="utf-8")
    block = text.split("```{glossary}", 1)[1].split("```", 1)[0]
    entries = []
    for chunk in re.split(r"\n\s*\n", block.strip("\n")):
        terms = [line.strip() for line in chunk.splitlines() if line.strip() and not line.startswith(" ")]
        if terms:
            entries.append(terms)
    return entries


def test_the_glossary_covers_the_jargon_and_every_entry_is_linked():
    terms = {t.lower() for entry in glossary_entries() for t in entry}
    needed = {"papermill", "gloo", "nccl", "pmi", "pmix", "gres", "allreduce", "batchnorm", "top-1 error",
              "tensor fusion", "cudnn", "munge", "slurmctld", "smoke profile", "full profile"}
    assert needed <= terms, f"the glossary lacks {sorted(needed - terms)}"
    linked = {(a or b).strip().lower() for page in toc_pages() if page.name != "glossary.md"
              for a, b in TERM.findall(prose(page))}
    assert linked <= terms, f"{{term}} links to terms the glossary lacks: {sorted(linked - terms)}"
    unlinked = [entry for entry in glossary_entries() if not linked & {t.lower() for t in entry}]
    assert not unlinked, f"glossary entries no page links to: {unlinked}"


def test_the_intros_numbers_are_the_sources():
    """book/intro.md is prose, not a notebook: its table of source results is checked here."""
    from guide_utils.results import sources
    from guide_utils.core.scaling import speedup

    intro = (REPO / "book" / "intro.md").read_text(encoding="utf-8")
    for one, many in ((3, 9), (2, 8)):
        a = sources.thesis_table(one)["images_per_second"].iloc[0]
        b = sources.thesis_table(many).query("gpus == 32")["images_per_second"].iloc[0]
        assert f"{b:.2f} vs {a:.2f} images/s ({speedup(b, a):.1f}x)" in intro
    naive = sources.thesis_quality(4).set_index("gpus")["top1_acc"]
    assert f"{naive[32]:.1f} % top-1 vs {naive[1]:.1f} % on 1 GPU" in intro
    t12 = sources.thesis_quality(6)
    base = t12.query("baseline").iloc[0]
    best = t12[(t12["gpus"] == 32) & t12["framework"].str.startswith("Horovod")].iloc[0]
    assert f"{best.top1_acc:.2f} % top-1 in 6 h 36 min vs {base.top1_acc:.2f} %" in intro
    assert abs(best.wall_hours - (6 + 36 / 60)) < 1e-3
    # "No 32-GPU run of the thesis reached the single GPU's accuracy exactly"
    runs32 = [sources.thesis_quality(e).query("gpus == 32")["top1_acc"].max() for e in range(4, 10)]
    assert max(runs32) < base.top1_acc and "No 32-GPU run of" in intro


def test_the_slurm_page_states_the_pinned_pytorch_s_gpu_kernels_as_they_are():
    """The prose on which GPUs the pinned wheel runs on is read back from the wheel itself."""
    torch = pytest.importorskip("torch")
    text = " ".join((REPO / "book" / "slurm.md").read_text().split())
    said = re.search(r"pins \((\S+) built with CUDA (\S+)\) has kernels for compute capabilities "
                     r"(sm_\d+) to (sm_\d+)", text)
    assert said, "book/slurm.md no longer says which GPUs the pinned PyTorch has kernels for"
    arch = [a for a in torch.cuda.get_arch_list() if a.startswith("sm_")]
    assert said.groups() == (torch.__version__.split("+")[0], torch.version.cuda, arch[0], arch[-1])
    assert "sm_70" not in arch and "sm_80" in arch and "sm_90" in arch  # V100 out, A100 and H100 in


def test_day_ones_cost_example_is_the_shipped_arrays_and_the_planners_output(capsys):
    """book/day_one.md once priced "eight tasks of four GPUs" where the shipped arrays are three
    tasks of two nodes: its example is read back against the sbatch files and the planner."""
    from guide_utils.perf import planner

    text = (REPO / "book" / "day_one.md").read_text(encoding="utf-8")
    for name in ("04_naive_scaling", "05_linear_scaling_rule", "06_learning_rate_warmup"):
        sbatch = (REPO / "slurm_examples" / f"{name}.sbatch").read_text()
        assert "#SBATCH --array=0-2" in sbatch and "#SBATCH --nodes=2" in sbatch, name
        assert "PER_WORKER_BATCHES=(32 64 128)" in sbatch, name
    flat = " ".join(text.split())
    assert "three tasks (per-worker batches 32, 64 and 128) of two nodes each" in flat
    assert "three such tasks for 40 hours each are 960 GPU-hours" in flat and 3 * 8 * 40 == 960
    command = re.search(r"python -m guide_utils plan (.*?)\n# \.\.\.", text, re.S).group(1)
    assert planner.main(command.replace("\\\n", " ").split()) == 0
    printed = capsys.readouterr().out
    said = re.findall(r"^# ((?:training|cost): .*)$", text, re.M)
    assert len(said) == 2 and all(line in printed for line in said), printed


# myst-nb splits a glue role's format spec off at its last colon: `path::key` without one
# becomes the key `path:`, found nowhere, and the strict build fails on the warning.
CROSS_GLUE = re.compile(r"\{glue(?::text)?\}`([^`]*::[^`]*)`")


@pytest.mark.parametrize("page", sorted((REPO / "book").glob("*.md")), ids=lambda p: p.name)
def test_every_glue_from_another_page_has_a_format_spec(page):
    bare = [m for m in CROSS_GLUE.findall(page.read_text()) if ":" not in m.split("::", 1)[1]]
    assert not bare, f"add a format spec (:s, :d, :.2f) to {bare}: myst-nb reads path::key alone as the key 'path:'"
