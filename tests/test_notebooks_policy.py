"""Notebooks follow the storage policy in scripts/notebooks.py (outputs only where nbval checks)."""

import importlib.util
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
spec = importlib.util.spec_from_file_location("notebook_policy", REPO / "scripts" / "notebooks.py")
policy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(policy)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_follows_the_policy(path):
    assert policy.check(path) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_calls_the_library_instead_of_redefining_it(path):
    """A notebook cell that defines functions or classes is re-implementing guide_utils."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            lines = [ln for ln in cell.source.splitlines() if ln.startswith(("def ", "class "))]
            assert not lines, f"{path.name}: {lines[0]!r}: move it into guide_utils and call it"


def test_policy_catches_violations(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
    nb.cells[0].outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=1)]
    nb.cells[0].execution_count = 1
    path = tmp_path / "bad.ipynb"
    nbformat.write(nb, path)
    problems = policy.check(path)
    assert any("kernelspec" in p for p in problems)
    assert any("title" in p for p in problems)
    assert any("parameters" in p for p in problems)
    assert any("stripped" in p for p in problems)


def test_a_parameter_papermill_cannot_read_is_a_violation(tmp_path):
    # papermill parses the parameters cell line by line; an '=' in a comment makes it skip the
    # line, and a batch job's `-p run_verify False` then changes nothing
    cell = nbformat.v4.new_code_cell("steps = 10  # read\nrun_verify = True  # the k = 32 points\n",
                                     metadata={"tags": ["parameters"]})
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# T"), cell],
                                  metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    path = tmp_path / "params.ipynb"
    nbformat.write(nb, path)
    assert policy.check(path) == ["params.ipynb: papermill cannot read the parameter 'run_verify' "
                                  "(an '=' in its comment?)"]
