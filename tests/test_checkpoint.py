"""Checkpoints: atomic, pruned, newest-readable-first, metadata-checked, RNG round-trip."""

import random

import numpy as np
import pytest
import torch

from guide_utils.engine import checkpoint
from guide_utils.core.errors import GuideError


def _state(value: float, model: str = "m"):
    net = torch.nn.Linear(2, 2)
    torch.nn.init.constant_(net.weight, value)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.ones(1, 2)).sum().backward()
    opt.step()  # creates momentum buffers
    return {"meta": {"model": model}, "model": net.state_dict(), "optimizer": opt.state_dict(), "epoch": 1}


def test_round_trip_and_pruning(tmp_path):
    for e in range(1, 6):
        checkpoint.save(tmp_path, _state(float(e)), epoch=e, keep=3)
    (tmp_path / "notes.txt").write_text("mine")
    checkpoint.save(tmp_path, _state(6.0), epoch=6, keep=3)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["checkpoint-epoch0004.pt", "checkpoint-epoch0005.pt", "checkpoint-epoch0006.pt", "notes.txt"]
    loaded = checkpoint.load_latest(tmp_path)
    assert loaded.epoch == 6 and float(loaded.state["model"]["weight"][0, 0]) == pytest.approx(5.9)  # 6 - lr*grad
    assert loaded.state["optimizer"]["state"][0]["momentum_buffer"].shape == (2, 2)


def test_order_comes_from_names_not_mtimes(tmp_path):
    checkpoint.save(tmp_path, _state(2.0), epoch=2, step=40, keep=5)
    checkpoint.save(tmp_path, _state(1.0), epoch=2, keep=5)  # written later, but older in training
    assert checkpoint.load_latest(tmp_path).step == 40


def test_truncated_newest_falls_back_with_one_line(tmp_path, capsys):
    checkpoint.save(tmp_path, _state(1.0), epoch=1)
    newest = checkpoint.save(tmp_path, _state(2.0), epoch=2)
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])
    loaded = checkpoint.load_latest(tmp_path)
    assert loaded.epoch == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoint-epoch0002.pt is unreadable" in err[0]
    assert newest.exists()  # reported, never deleted


def test_all_broken_is_a_clear_error(tmp_path):
    (tmp_path / "checkpoint-epoch0003.pt").write_bytes(b"garbage")
    with pytest.raises(GuideError, match="no readable checkpoint") as exc:
        checkpoint.load_latest(tmp_path)
    assert "\n" not in str(exc.value)


def test_metadata_mismatch(tmp_path):
    checkpoint.save(tmp_path, _state(1.0, model="resnet50"), epoch=1)
    with pytest.raises(GuideError, match="model=resnet50, this run has model=small_resnet"):
        checkpoint.load_latest(tmp_path, expect={"model": "small_resnet", "unrelated": 1})
    assert checkpoint.load_latest(tmp_path, expect={"model": "resnet50"}).epoch == 1


def test_empty_directory(tmp_path):
    assert checkpoint.load_latest(tmp_path) is None
    assert checkpoint.load_latest(tmp_path / "missing") is None


def test_interrupted_write_keeps_the_previous_checkpoints(tmp_path, monkeypatch):
    checkpoint.save(tmp_path, _state(1.0), epoch=1)

    def crash(*args):
        raise OSError("node lost power")

    monkeypatch.setattr(checkpoint.os, "replace", crash)
    with pytest.raises(OSError):
        checkpoint.save(tmp_path, _state(2.0), epoch=2)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-epoch0001.pt"]  # no stray temp file


def test_unwritable_directory(tmp_path):
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(GuideError, match="not writable"):
        checkpoint.ensure_writable(tmp_path / "file.txt" / "sub")


def test_rng_round_trip_through_weights_only_load(tmp_path):
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    state = checkpoint.rng_state()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    checkpoint.save(tmp_path, {"model": {}, "rng": state}, epoch=1)
    torch.rand(10), np.random.rand(10), random.random()
    checkpoint.set_rng_state(checkpoint.load_latest(tmp_path).state["rng"])
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]
