"""Run records: written whole, never overwritten, resumable, tolerant readers."""

import json

import numpy as np
import pytest
import torch

from guide_utils.core.errors import GuideError
from guide_utils.core.records import RunRecorder, read_run, read_runs, runs_table


def _run(d, name="r", **config):
    rec = RunRecorder(d, name, config={"model": "m", "workers": 2, "global_batch": 64, **config},
                      environment={"host": "h"})
    for e, err in enumerate([50.0, 30.0, 35.0], start=1):
        rec.epoch(epoch=e, val_top1_err=err, val_top5_err=err / 10, images_per_second=100.0 * e, seconds=2.0)
    rec.summary(completed_epochs=3)
    return rec


def test_write_and_read_back(tmp_path):
    run = read_run(_run(tmp_path).path)
    assert run.config["workers"] == 2 and run.environment == {"host": "h"}
    assert run.epochs["val_top1_err"].tolist() == [50.0, 30.0, 35.0]
    assert run.summary["completed_epochs"] == 3 and run.skipped_lines == 0


def test_never_overwrites(tmp_path):
    (tmp_path / "r.jsonl").write_text("someone's notes\n")
    assert _run(tmp_path).path.name == "r-2.jsonl"
    assert _run(tmp_path).path.name == "r-3.jsonl"
    assert (tmp_path / "r.jsonl").read_text() == "someone's notes\n"


def test_resume_appends_and_last_epoch_wins(tmp_path):
    rec = _run(tmp_path)
    again = RunRecorder(tmp_path, "r", config={}, resume=True)
    assert again.path == rec.path
    again.epoch(epoch=3, val_top1_err=20.0)
    run = read_run(rec.path)
    assert run.epochs["val_top1_err"].tolist() == [50.0, 30.0, 20.0]
    assert [e["type"] for e in run.events] == ["resume"]


def test_malformed_lines_are_skipped_and_counted(tmp_path):
    path = _run(tmp_path).path
    lines = path.read_text().splitlines()
    lines.insert(3, "{not json")
    path.write_text("\n".join(lines) + '\n{"type": "epoch", "epo')
    run = read_run(path)
    assert run.skipped_lines == 2 and len(run.epochs) == 3


def test_not_a_record(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({"type": "epoch", "epoch": 1}) + "\n")
    with pytest.raises(GuideError, match="not a run record") as exc:
        read_run(p)
    assert "\n" not in str(exc.value)
    with pytest.raises(FileNotFoundError):
        read_run(tmp_path / "missing.jsonl")
    with pytest.raises(GuideError, match="does not exist"):
        read_runs(tmp_path / "nowhere")


def test_table(tmp_path):
    _run(tmp_path, "a")
    _run(tmp_path, "b", workers=4)
    table = runs_table(tmp_path)
    assert table["run"].tolist() == ["a", "b"] and table["workers"].tolist() == [2, 4]
    assert table["best_val_top1_err"].tolist() == [30.0, 30.0]
    assert table["final_val_top1_err"].tolist() == [35.0, 35.0]
    assert table["mean_images_per_second"].tolist() == [200.0, 200.0]
    assert table["total_seconds"].tolist() == [6.0, 6.0]


def test_scalars_serialise(tmp_path):
    rec = RunRecorder(tmp_path, "s", config={"milestones": (30, 60)})
    rec.epoch(epoch=np.int64(1), loss=torch.tensor(0.5), seconds=np.float32(1.5))
    run = read_run(rec.path)
    assert run.config["milestones"] == [30, 60]
    assert run.epochs.iloc[0].to_dict() == {"epoch": 1, "loss": 0.5, "seconds": 1.5}


def test_runs_starting_together_never_share_a_record(tmp_path, monkeypatch):
    """Array tasks of one job often start in the same instant with the same settings: a
    check-then-create would let both see the name free. Simulate exactly that (every
    existence check says "free"); the name must still be taken by creating the file."""
    from pathlib import Path

    from guide_utils.core.records import RunRecorder

    first = RunRecorder(tmp_path, "same", config={"i": 0})
    monkeypatch.setattr(Path, "exists", lambda self: False)
    second = RunRecorder(tmp_path, "same", config={"i": 1})
    assert first.path != second.path
    for r in (first, second):
        assert r.path.read_text().count('"type": "config"') == 1


def test_a_resumed_runs_summary_covers_every_epoch_of_its_record(tmp_path):
    """Both engines summarise through RunBook: after a resume the best validation error is the
    best of the whole record, not only of the epochs trained since (the PyTorch engine once
    reported the latter, the TensorFlow door the former)."""
    from guide_utils.core.config import make_config
    from guide_utils.engine.bookkeeping import RunBook
    from guide_utils.engine.plan import RunPlan

    cfg = make_config("smoke", results_dir=str(tmp_path), run_name="chunked")
    plan = RunPlan.make(cfg, workers=1, samples_per_worker=3200)
    row = {"lr": 0.1, "loss": 1.0, "train_top1_err": 50.0, "val_top5_err": 1.0, "seconds": 1.0}
    first = RunBook(cfg, plan, framework="pytorch", prefix="[t]", is_root=True, data="d", environment=dict)
    for epoch, err in ((1, 9.0), (2, 4.0)):
        first.epoch({**row, "epoch": epoch, "val_top1_err": err})
    again = RunBook(cfg, plan, framework="pytorch", prefix="[t]", is_root=True, data="d", environment=dict,
                    run_name="chunked", resume=True)
    for epoch, err in ((3, 6.0), (4, 7.0)):
        again.epoch({**row, "epoch": epoch, "val_top1_err": err})
    again.finish(completed_epochs=4, digests=["a", "a"])
    run = read_run(tmp_path / "chunked.jsonl")
    assert run.epochs["epoch"].tolist() == [1, 2, 3, 4]
    assert run.summary["best_val_top1_err"] == 4.0 and run.summary["ranks_agree"]
