"""The lock pins the whole stack: what is installed is exactly what requirements.lock says."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _canonical(line: str) -> str:
    name, _, version = line.strip().partition("==")
    return f"{re.sub(r'[-_.]+', '-', name).lower()}=={version}"


def _pins(text: str) -> set[str]:
    return {_canonical(line) for line in text.splitlines() if line.strip() and not line.startswith("#")}


def test_the_environment_is_the_lock():
    # Without PYTHONPATH: a src/ on it shows the editable install's build metadata
    # (src/guide_utils.egg-info) as one more, non-editable distribution.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    frozen = subprocess.run([sys.executable, str(REPO / "scripts" / "freeze.py")],
                            capture_output=True, text=True, check=True, env=env, cwd=REPO / "scripts").stdout
    installed, locked = _pins(frozen), _pins((REPO / "requirements.lock").read_text())
    assert installed - locked == set() and locked - installed == set(), (
        f"installed but not locked: {sorted(installed - locked)}; locked but not installed: "
        f"{sorted(locked - installed)}; after changing requirements.txt run `make lock` and commit the lock")


def test_a_package_installed_from_a_local_wheel_is_locked_by_its_version():
    """Horovod is installed from the wheel setup.sh builds: pip freeze would write
    ``horovod @ file:///tmp/...``, which no other machine can install."""
    from importlib import util

    spec = util.spec_from_file_location("freeze", REPO / "scripts" / "freeze.py")
    freeze = util.module_from_spec(spec)
    spec.loader.exec_module(freeze)
    listed = freeze.pins()
    assert listed and all("==" in line and "@" not in line for line in listed)
    assert not [line for line in listed if line.lower().startswith(("guide-utils", "guide_utils"))], \
        "the editable guide_utils is not a pin"


def test_every_requirement_is_locked_at_its_pinned_version():
    locked = _pins((REPO / "requirements.lock").read_text())
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            assert _canonical(line.split("#")[0]) in locked, f"{line.strip()} is not what the lock pins"
