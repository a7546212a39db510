"""The set-up by need (scripts/setup.sh): `make book` asks only for what the book needs, `make
test` for everything; the OCI image is in neither (the test that runs it builds it)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SETUP = REPO / "scripts" / "setup.sh"
TEST_ONLY = {"slurm-wlm", "munge", "shellcheck", "podman", "runc", "mmdebstrap", "nftables", "python3-apt"}


def _packages(purpose: str) -> set[str]:
    """The Debian packages the set-up checks for, by running its option and package lines alone."""
    text = SETUP.read_text()
    start, end = text.index("purpose=test\n"), text.index("say() {")
    script = f"set -- --for {purpose}\n{text[start:end]}\necho \"${{APT_PACKAGES[@]}}\"\n"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_books_set_up_installs_no_test_only_package():
    book, test = _packages("book"), _packages("test")
    assert {"openmpi-bin", "cmake", "chromium", "chromium-driver"} <= book
    assert not book & TEST_ONLY and TEST_ONLY <= test and book < test


def test_make_book_and_make_test_each_run_their_own_set_up():
    make = (REPO / "Makefile").read_text()
    assert re.search(r"^book: setup-book$", make, re.M) and re.search(r"^test: setup$", make, re.M)
    assert re.search(r"^setup-book:\n\tscripts/setup\.sh --for book$", make, re.M)
    assert "image build" not in SETUP.read_text(), "the OCI image is built by `make image` or its test, not the set-up"


@pytest.mark.parametrize("args", [["--for", "docs"], ["--fast"]])
def test_a_wrong_option_is_one_line_and_changes_nothing(args, tmp_path):
    proc = subprocess.run([str(SETUP), *args], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "VENV": str(tmp_path / "venv")})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("[setup] error:")
    assert not (tmp_path / "venv").exists()


def _candidates(path: str) -> list[str]:
    """The interpreters the set-up would try for a new venv, in order, with this PATH."""
    text = SETUP.read_text()
    block = text[text.index("unoptimized() {"):text.index("HOROVOD_VERSION=")]
    out = subprocess.run(["bash", "-c", f'{block}\necho "${{PYTHON_CANDIDATES[@]}}"'], capture_output=True,
                         text=True, check=True, env={"PATH": path})
    return out.stdout.split()


@pytest.mark.skipif(not Path("/usr/bin/python3.11").exists(), reason="no distribution python3.11 here")
def test_the_venv_prefers_the_distributions_python_over_a_build_without_pgo(tmp_path):
    """python3.11 on PATH is used as it is when it is the distribution's; one that reports no
    --enable-optimizations in its build (pyenv's default; a venv's python stands in for it:
    it lives outside /usr/bin and carries its base's build flags, which Debian strips) comes
    after /usr/bin/python3.11."""
    assert _candidates("/usr/bin:/bin") == ["python3.11", "/usr/bin/python3.11"]
    subprocess.run(["/usr/bin/python3.11", "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    assert _candidates(f"{tmp_path / 'v' / 'bin'}:/usr/bin:/bin") == ["/usr/bin/python3.11", "python3.11"]
