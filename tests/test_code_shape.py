"""The library stays readable: no function longer than about one screen, no module longer
than a few, and a family of modules gets a folder, not a shared prefix."""

import ast
from collections import Counter
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 80
MAX_MODULE_LINES = 400
# Modules in one folder whose names start with the same word (``doctor_probes``,
# ``doctor_facts``, ...) are a folder that was not made: four or more make one.
MAX_FAMILY = 3


def test_no_function_is_longer_than_a_screen():
    long = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these into smaller functions: " + "; ".join(long)


def test_no_module_is_longer_than_400_lines():
    long = [f"{path.relative_to(SRC)} ({lines} lines)" for path in sorted(SRC.rglob("*.py"))
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"split these along a seam into modules of at most {MAX_MODULE_LINES} lines: " + "; ".join(long)


def families(folder: Path) -> dict[str, list[str]]:
    """The modules of ``folder`` by the word their name starts with (before the first ``_``),
    for the words that more than :data:`MAX_FAMILY` of them share."""
    stems = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("__"))
    counts = Counter(stem.split("_")[0] for stem in stems)
    return {word: [s for s in stems if s.split("_")[0] == word] for word, n in counts.items() if n > MAX_FAMILY}


def test_a_family_of_modules_is_a_folder_not_a_prefix(tmp_path):
    for name in ("doctor", "doctor_facts", "doctor_probes", "doctor_report", "pack", "sites"):
        (tmp_path / f"{name}.py").touch()
    assert families(tmp_path) == {"doctor": ["doctor", "doctor_facts", "doctor_probes", "doctor_report"]}
    (tmp_path / "doctor_report.py").unlink()
    assert families(tmp_path) == {}  # three may share a word
    found = [f"{folder.relative_to(SRC)}/{{{', '.join(names)}}}"
             for folder in sorted({p.parent for p in SRC.rglob("*.py")}) for names in families(folder).values()]
    assert not found, "make a folder of each family, its modules named without the prefix: " + "; ".join(found)
