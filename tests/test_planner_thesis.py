"""The planner's time to solution against the thesis's whole trainings (Tables 10-15): the
32-GPU run, every row of the comparison table, and what is lost without the overhead terms."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from guide_utils.core.errors import GuideError
from guide_utils.perf import planner, solution, thesis_runs
from guide_utils.perf.model import Network, Workload, predict
from guide_utils.results import sources

RESNET50 = 25_557_032
THESIS = {"params": RESNET50, "throughputs": {128: 207.79}, "network": Network.of("56Gbit/s", "5us"),
          "gpus_per_node": 4, "max_nodes": 8, "nodes": 8, "target": planner.Target(min_efficiency=0.5)}


def measured_32() -> float:
    """Table 12: Horovod + PyTorch, 32 GPUs x 128, 0 days 6 hours 36 minutes."""
    t12 = sources.thesis_table(12)
    return float(t12[(t12["gpus"] == 32) & t12["framework"].str.startswith("Horovod")]["wall_hours"].iloc[0])


def test_the_thesis_numbers_the_issue_rests_on():
    """6 h 36 min on 32 GPUs, 6 d 4 h 16 min on one: a 22.5x speedup, 70 % of 32 (time to
    solution), against 6104.32 / (32 x 207.79) = 92 % over the first 200 batches (Tables 3, 9)."""
    base = float(sources.thesis_table(11).query("baseline")["wall_hours"].iloc[0])
    assert measured_32() == pytest.approx(6 + 36 / 60) and base == pytest.approx(6 * 24 + 4 + 16 / 60, abs=1e-3)
    assert base / measured_32() == pytest.approx(22.46, abs=0.01)
    assert base / (32 * measured_32()) == pytest.approx(0.702, abs=0.001)
    assert 32 * measured_32() == pytest.approx(211.2)
    assert 6104.32 / (32 * 207.79) == pytest.approx(0.918, abs=0.001)


def test_planner_lands_within_15_percent_of_the_thesis_32_gpu_run():
    choice = planner.plan(**THESIS)["choice"]
    assert (choice["nodes"], choice["workers"], choice["global_batch"]) == (8, 32, 4096)
    assert abs(choice["wall_hours"] / measured_32() - 1) < 0.15, choice["wall_hours"]
    assert abs(choice["gpu_hours"] / (32 * measured_32()) - 1) < 0.15, choice["gpu_hours"]
    assert choice["efficiency"] > 0.95 and choice["tts_efficiency"] < 0.85  # the two efficiencies differ


def test_without_the_time_to_solution_terms_the_planner_promises_5_hours_again():
    """The step alone (solution.NONE) is the old answer, 5.0 h and 161 GPU-hours: more than
    15 % short of the 6.6 h measured. The default terms add more than an hour."""
    bare = planner.plan(**THESIS, overheads=solution.NONE)["choice"]
    assert bare["wall_hours"] == pytest.approx(5.04, abs=0.01) and bare["gpu_hours"] == pytest.approx(161.4, abs=0.2)
    assert bare["wall_hours"] < 0.85 * measured_32()
    full = planner.plan(**THESIS)["choice"]
    assert full["wall_hours"] - bare["wall_hours"] > 1.0
    for term in ("first_batch_hours", "validation_hours", "checkpoint_hours", "epoch_hours"):
        assert full[term] > 0 and bare[term] == 0, term


def test_time_to_solution_by_hand():
    """32 x 128 over 56 Gbit/s, 5 us: step 0.616006545 + 2*31*5e-6 + 2*31/32 * 102228128 / 7e9
    = 0.644608... s; 313 steps per epoch (1281167 / 4096 = 312.8); first batch 10 s, so 10 -
    step extra; validation 50000 / 32 / (3 x 128 / 0.616006545) = 2.5067 s; checkpoint
    25557032 x 8 / 1e9 = 0.2045 s; 30 s per epoch; 90 epochs."""
    p = predict(Workload(RESNET50, 128, 207.79), Network.of("56Gbit/s", "5us"), 32)
    step = 0.616006545069541 + 2 * 31 * 5e-6 + 2 * 31 / 32 * 102_228_128 / 7e9
    assert p.step_s == pytest.approx(step, rel=1e-12)
    t = solution.time_to_solution(p, solution.Overheads(first_batch_s=10, epoch_s=30), epochs=90, images=1_281_167)
    per_epoch = 313 * step + (10 - step) + 50_000 / 32 / (3 * 128 / 0.616006545069541) + 25_557_032 * 8 / 1e9 + 30
    assert t["steps_per_epoch"] == 313
    assert t["wall_hours"] == pytest.approx(90 * per_epoch / 3600, rel=1e-12)
    assert t["gpu_hours"] == pytest.approx(32 * t["wall_hours"], rel=1e-12)
    unsharded = solution.time_to_solution(p, solution.Overheads(validation_sharded=False), epochs=90,
                                          images=1_281_167)
    assert unsharded["validation_hours"] == pytest.approx(32 * t["validation_hours"], rel=1e-12)
    with pytest.raises(GuideError, match="--epoch-overhead-s must not be negative"):
        solution.Overheads(epoch_s=-1)


def test_the_table_has_every_run_of_tables_10_to_15_once():
    table = thesis_runs.table()
    expected = []
    for n in range(10, 16):
        for r in sources.thesis_table(n).itertuples():
            if n > 11 and r.baseline:
                continue  # the 1-GPU baseline of Table 11, cited again in Tables 12 and 14
            expected.append((n, thesis_runs.script(r.framework), int(r.gpus), int(r.per_worker_batch),
                             getattr(r, "wall_hours", math.nan)))
    got = [(int(r.tables.split(",")[0]), r.script, r.gpus, r.batch, r.measured_h) for r in table.itertuples()]
    assert len(got) == len(expected) == 18
    for g, e in zip(got, expected):
        assert g[:4] == e[:4] and (g[4] == pytest.approx(e[4]) or (math.isnan(g[4]) and math.isnan(e[4]))), (g, e)
    base = table[table["tables"] == "11, 12, 14"]
    assert len(base) == 1 and base["measured_h"].iloc[0] == pytest.approx(148.2667)
    assert table["measured_gpu_h"].equals(table["measured_h"] * table["gpus"])
    assert (table[table["tables"] == "10"]["role"] == "no time").all()  # Table 10 reports no times


def test_calibration_fits_two_runs_and_says_which():
    """The epoch term is fitted on Table 12's 16 and 24 GPUs alone; every other run is out of
    sample. Those Horovod runs land within 6 %; the plain PyTorch 32-GPU run misses most."""
    table = thesis_runs.table()
    assert sorted(table[table["role"] == "fit"]["gpus"]) == [16, 24]
    epoch_s = thesis_runs.calibrate_epoch_s()
    assert 20 < epoch_s < 60
    timed = table.dropna(subset=["measured_h"])
    held = timed[timed["role"] == "held out"]
    horovod = held[held["script"] == "horovod"]
    assert len(held) == 8 and (horovod["error_pct"].abs() < 6).all(), horovod
    worst = timed.loc[timed["error_pct"].abs().idxmax()]
    assert (worst["script"], worst["gpus"]) == ("pytorch", 32) and 10 < worst["error_pct"] < 25


def test_plan_command_takes_your_own_overheads():
    """--first-batch-s 0 --epoch-overhead-s 0 --validation-images 0: the steps and one
    checkpoint per epoch are left (5.04 h + 90 x 0.2 s at 32 GPUs), and 30 min of start-up: 5.55 h.
    A negative term is one line."""
    base = [sys.executable, "-m", "guide_utils", "plan", "--throughput", "128:207.79", "--network", "56Gbit/s",
            "--nodes", "8", "--max-nodes", "8", "--min-efficiency", "0.5"]
    proc = subprocess.run([*base, "--first-batch-s", "0", "--epoch-overhead-s", "0", "--validation-images", "0",
                           "--startup-min", "30"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "training: 5.5 h wall clock" in proc.stdout and "start-up 0.5" in proc.stdout, proc.stdout
    bad = subprocess.run([*base, "--first-batch-s", "-1"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().endswith("--first-batch-s must not be negative, got -1.0")
