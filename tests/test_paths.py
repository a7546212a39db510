"""Where the guide's files are (guide_utils.core.paths): the repository from a checkout or
$GUIDE_ROOT, one line when neither (a wheel install), and the data shipped in the package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from conftest import REPO, child_env
from guide_utils.cluster import container, sites
from guide_utils.core.errors import GuideError
from guide_utils.core.paths import MARKER, import_root, package_dir, packaged, pythonpath, repo_path, repo_root


@pytest.fixture
def no_guide_root(monkeypatch):
    monkeypatch.delenv("GUIDE_ROOT", raising=False)


def test_the_repository_is_found_from_the_checkout(no_guide_root):
    assert repo_root() == REPO.resolve()
    assert repo_path("containers", "guide.def").is_file()
    assert container.REPO == REPO.resolve() and container.DEFINITION.is_file() and container.PROFILE.is_file()
    assert Path(sites.read_site("ci").file).resolve().is_relative_to(REPO.resolve())  # its profiles


def test_guide_root_is_honoured(tmp_path, monkeypatch):
    (tmp_path / MARKER).parent.mkdir(parents=True)
    (tmp_path / MARKER).write_text("# a copy\n")
    monkeypatch.setenv("GUIDE_ROOT", str(tmp_path))
    assert repo_root() == tmp_path
    assert container.PROFILE == tmp_path / "slurm_examples" / "sites" / "apptainer-example.sh"


def test_a_guide_root_without_the_repository_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("GUIDE_ROOT", str(tmp_path))
    with pytest.raises(GuideError, match="GUIDE_ROOT=.* has no slurm_examples/lib/guide.sh; set GUIDE_ROOT") as err:
        repo_root()
    assert "\n" not in str(err.value)


def test_a_package_outside_any_checkout_asks_for_guide_root(tmp_path, no_guide_root):
    copy = tmp_path / "site-packages" / "guide_utils"
    shutil.copytree(package_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    with pytest.raises(GuideError, match="not inside the guide's repository.*set GUIDE_ROOT") as err:
        repo_root(start=copy)
    assert "\n" not in str(err.value)
    # The copy alone, as a wheel install would be: it imports, reads its own data, and the
    # repository's files (here the container's) fail with that one line, not at import.
    code = ("import guide_utils.core.paths as p; from guide_utils.cluster import container; "
            "print(p.import_root()); print(p.packaged('results', 'recorded', 'two_workers.jsonl').is_file()); "
            "container.DEFINITION")
    env = child_env(PYTHONPATH=str(copy.parent))
    env.pop("GUIDE_ROOT", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path)
    assert proc.stdout.splitlines() == [str(copy.parent.resolve()), "True"], proc.stdout + proc.stderr
    assert "GuideError: guide_utils at" in proc.stderr and "set GUIDE_ROOT" in proc.stderr, proc.stderr


def test_a_child_process_imports_this_copy_of_the_package():
    assert import_root() == (REPO / "src").resolve()
    assert pythonpath().split(os.pathsep)[0] == str(import_root())


def test_the_packaged_data_is_readable():
    assert packaged("results", "source_data", "thesis_table_01.csv").read_text().startswith("# thesis Table 1 ")
    assert packaged("results", "recorded", "quality_sweep_mnist1d.csv").is_file()


def test_every_data_file_of_the_package_ships_in_the_wheel():
    # A file under results/ that no package-data pattern names would be missing from a wheel.
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    results = package_dir() / "results"
    files = [f.relative_to(results).as_posix() for f in results.rglob("*")
             if f.is_file() and f.suffix not in (".py", ".pyc")]
    assert files
    missing = [f for f in files if not any(fnmatch(f, pat) for pat in patterns["guide_utils.results"])]
    assert not missing, f"add to [tool.setuptools.package-data] in pyproject.toml: {missing}"
