"""pack-dataset writes a real ImageFolder archive the engine trains on; rendezvous prints
the job's host:port."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile

import pytest

from guide_utils.data.loaders import build_data
from guide_utils.cluster.pack import pack_digits


def test_the_digits_archive_has_the_imagefolder_layout_and_the_same_split(tmp_path):
    out = pack_digits(tmp_path / "d.tar")
    with tarfile.open(out) as tar:
        names = tar.getnames()
        # The "data" filter (PEP 706) came with Python 3.11.4; Debian 12's 3.11.2 has none.
        tar.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    digits = build_data("digits")
    assert sum(n.startswith("digits/train/") and n.endswith(".png") for n in names) == len(digits.train)
    assert sum(n.startswith("digits/val/") and n.endswith(".png") for n in names) == len(digits.val)
    folder = build_data(str(tmp_path / "digits"), image_size=8)
    assert (len(folder.train), len(folder.val), folder.num_classes) == (len(digits.train), len(digits.val), 10)


def test_an_existing_archive_is_never_overwritten(tmp_path):
    target = tmp_path / "mine.tar"
    target.write_text("precious")
    out = subprocess.run([sys.executable, "-m", "guide_utils", "pack-dataset", "digits", str(target)],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip() == (f"python -m guide_utils pack-dataset: error: {target} already exists; "
                                  "remove it or choose another output path")
    assert target.read_text() == "precious"


@pytest.mark.parametrize("env, expected, code", [
    ({"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[07-08]"}, "gpu07:24242", 0),
    ({}, "not inside a Slurm job", 2),
])
def test_rendezvous_prints_host_and_port(env, expected, code):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    out = subprocess.run([sys.executable, "-m", "guide_utils", "rendezvous"], capture_output=True, text=True,
                         env={**clean, **env})
    assert out.returncode == code
    assert expected in (out.stdout if code == 0 else out.stderr)
    assert "Traceback" not in out.stderr
