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


def _make_venv(tmp_path: Path, python_on_path: str) -> tuple[str, Path]:
    """Run the set-up's venv step alone with ``python_on_path`` as the python3.11 on PATH
    (a wrapper that logs each call and runs the distribution's, making venvs without pip
    to stay quick): what it printed, and the log of the wrapper's calls."""
    text = SETUP.read_text()
    candidates = text[text.index("PYTHON_CANDIDATES="):text.index("HOROVOD_VERSION=")]
    step = text[text.index("# --- virtual environment"):text.index("pip=(")]
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3.11").write_text(f'#!/bin/bash\necho "$*" >> {log}\n{python_on_path}\n')
    (bin_dir / "python3.11").chmod(0o755)
    script = f'say() {{ echo "$*"; }}\ndie() {{ echo "error: $*"; exit 1; }}\nVENV={tmp_path / "venv"}\n{candidates}{step}'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout, log


PASS_THROUGH = 'if [[ $1 == -m && $2 == venv ]]; then exec /usr/bin/python3.11 -m venv --without-pip "${@:3}"; fi\n' \
               'exec /usr/bin/python3.11 "$@"'


@pytest.mark.skipif(not Path("/usr/bin/python3.11").exists(), reason="no distribution python3.11 here")
def test_the_venv_takes_python_on_path_and_the_distributions_when_that_cannot(tmp_path):
    """python3.11 on PATH makes the venv, whatever its build (pyenv's, without PGO, is slower
    than Debian's, which was set aside after two crashes under it: docs/setup.md); one that
    cannot make a venv is passed over for /usr/bin/python3.11."""
    said, log = _make_venv(tmp_path / "a", PASS_THROUGH)
    assert f"created {tmp_path / 'a' / 'venv'} with python3.11" in said, said
    assert "-m venv" in log.read_text() and (tmp_path / "a" / "venv" / "bin" / "python").exists()
    said, log = _make_venv(tmp_path / "b", 'if [[ $1 == -m ]]; then exit 1; fi\nexec /usr/bin/python3.11 "$@"')
    assert f"created {tmp_path / 'b' / 'venv'} with /usr/bin/python3.11" in said, said
    assert "-m venv" in log.read_text()  # tried first


def test_kept_bytecode_is_used_only_where_it_matches_its_source(tmp_path):
    """setup.sh links the bytecode compiled for an earlier venv with the same pins; its check:
    a .pyc that records its source's size and time matches, one after the source changed
    (a venv whose files uv copied) or a missing one does not, and then everything is compiled."""
    import os
    import py_compile
    import sys

    (tmp_path / "pkg").mkdir()
    source = tmp_path / "pkg" / "__init__.py"
    source.write_text("x = 1\n")
    check = [sys.executable, str(REPO / "scripts" / "pyc_matches.py"), "pkg"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def verdict() -> int:
        return subprocess.run(check, env=env, capture_output=True).returncode

    assert verdict() == 1  # no bytecode yet
    py_compile.compile(str(source), invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    assert verdict() == 0
    os.utime(source, (1, 1))  # same size, another time: as a copy made without keeping it
    assert verdict() == 1
