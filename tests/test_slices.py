"""The SLICES slides' benchmark (issue 25): the experiment ``slices`` in the catalogue, its
submissions at a playbook-built site (slurm_examples/sites/byoc.sh), the network kept in every
run record, and the planner's prediction of its efficiency at 1 and 10 Gbit/s."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from guide_utils.core.errors import GuideError
from guide_utils.studies.experiments import EXPERIMENTS, plan, runs
from test_site_profiles import EXAMPLES, REPO, dry_run


def test_the_grid_is_the_slides_and_ten_separate_jobs_per_batch():
    full = runs("slices", "full")
    grid = [(r.workers, r.settings["per_worker_batch"], r.copies) for r in full]
    assert grid[:30] == [(n, b, 1) for n in range(1, 11) for b in (32, 64, 96)]
    assert grid[30:] == [(1, b, 10) for b in (32, 64, 96)]
    assert all(r.settings["data"] == "synthetic" and r.settings["max_steps_per_epoch"] == 200 for r in full)
    assert {r.settings["dist"] for r in full if r.workers > 1} == {"horovod"}
    assert {r.settings["dist"] for r in full if r.workers == 1} == {"none"}
    assert EXPERIMENTS["slices"].source == "SLICES slides, Benchmark parameters"


def test_ten_copies_become_a_job_array_of_the_one_gpu_baseline():
    commands = {i: c for i, _, c in plan("slices", "full")}
    assert commands[30].startswith("slurm_examples/submit.sh slurm_examples/01_single_gpu_baseline.sbatch "
                                   "--array=0-9 -- ")
    assert "--per-worker-batch 32" in commands[30] and "--array" not in commands[0]
    assert commands[29].startswith("slurm_examples/submit.sh slurm_examples/03_multi_node_horovod.sbatch "
                                   "--workers=10 -- ")


def test_smoke_keeps_the_structure_at_two_processes():
    smoke = runs("slices", "smoke")
    assert len(smoke) == len(runs("slices", "full")) == 33
    assert max(r.workers for r in smoke) == 2 and max(r.copies for r in smoke) == 2
    assert smoke[30].label.endswith("-> smoke: 2 copies") and smoke[30].settings["model"] == "small_resnet"
    [(_, _, command)] = plan("slices", "smoke", 30)
    assert command.startswith("for copy in $(seq 2); do python -m guide_utils.train --profile smoke ")
    assert command.endswith(" --dist none & done; wait")


def test_copies_are_one_worker_jobs_only():
    from guide_utils.studies.experiment_plans import _throughput_run

    with pytest.raises(GuideError, match="separate one-worker jobs"):
        _throughput_run(2, 32, copies=10)


def test_a_copies_run_is_not_one_local_launch(tmp_path):
    from guide_utils.studies.experiments import launch

    with pytest.raises(GuideError, match="is 2 separate jobs, not one launch; start them as: for copy in"):
        launch("slices", 30, "smoke", results_dir=str(tmp_path))
    assert not any(tmp_path.iterdir())


def test_the_dry_run_prints_33_submissions_and_the_network_note():
    out = subprocess.run([sys.executable, "-m", "guide_utils", "experiments", "run", "slices", "--profile", "full",
                          "--dry-run"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].endswith("profile full, 33 run(s)") and lines[1].startswith("note: the network is not a run")
    assert sum(line.startswith("    $ slurm_examples/submit.sh") for line in lines) == 33
    assert out.stdout.count("--array=0-9") == 3 and out.stdout.count("10 independent copies") == 3


def test_the_compact_plan_names_the_source_not_the_thesis(capsys):
    from guide_utils.studies.experiments import print_plan

    print_plan("slices", "full", commands=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[3].split()[:2] == ["run", "source"]
    assert lines[-2].split()[:4] == ["[32]", "10x", "1", "GPU"]
    assert max(map(len, lines)) <= 100


@pytest.mark.parametrize("index, nodes, array", [(0, 1, None), (5, 2, None), (29, 10, None), (31, 1, "0-9")])
def test_at_a_playbook_built_site_each_worker_is_a_node(index, nodes, array):
    """byoc.sh has one GPU per node (the slides' testbed): N workers are N nodes of one task and
    one GPU; the ten copies are an array of one-GPU jobs, each logging to its own file."""
    [(_, run, command)] = plan("slices", "full", index)
    argv = shlex.split(command)
    out = dry_run("byoc", REPO / argv[1], *argv[2:])
    assert out.returncode == 0, out.stderr
    opts = shlex.split(out.stdout)
    script = (REPO / argv[1]).read_text()
    given = dict(o.split("=", 1) for o in opts if o.startswith("--") and "=" in o)
    own = re.findall(r"^#SBATCH --nodes=(\d+)", script, re.M)
    assert int(given.get("--nodes") or own[0]) == nodes
    assert given.get("--ntasks-per-node", "1") == "1"
    assert given["--partition"] == "gpu" and given["--gpus-per-node"] == "1"
    assert given.get("--array") == array
    assert given["--output"].endswith("%x-%A_%a.out" if array else "%x-%j.out")


def test_every_run_record_keeps_the_network(monkeypatch):
    from guide_utils.engine.bookkeeping import environment

    monkeypatch.setenv("GUIDE_NETWORK", "1Gbit/s")
    assert environment("none", 1)["network"] == "1Gbit/s"
    monkeypatch.setenv("GUIDE_NETWORK", "")
    assert environment("none", 1)["network"] is None
    monkeypatch.delenv("GUIDE_NETWORK")
    assert environment("none", 1)["network"] is None


def test_the_profile_exports_the_network_and_a_submission_overrides_it():
    """Sourced in the job, byoc.sh exports 10Gbit/s unless the submission said 1Gbit/s
    (submit.sh passes the environment on with --export=ALL)."""
    probe = 'source "$1"; bash -c \'printf %s "$GUIDE_NETWORK"\''
    for given, expected in ((None, "10Gbit/s"), ("1Gbit/s", "1Gbit/s")):
        env = {"PATH": "/usr/bin:/bin", **({"GUIDE_NETWORK": given} if given else {})}
        out = subprocess.run(["bash", "-c", probe, "probe", str(EXAMPLES / "sites" / "byoc.sh")], env=env,
                             capture_output=True, text=True)
        assert (out.returncode, out.stdout) == (0, expected), out.stderr


# -- The prediction -----------------------------------------------------------------------

def test_the_faster_network_is_never_predicted_worse():
    from guide_utils.perf.slices import prediction, thesis_one_gpu_rates

    table = prediction(thesis_one_gpu_rates())
    assert len(table) == 2 * 3 * 10 and list(table["network"].unique()) == ["1Gbit/s", "10Gbit/s"]
    wide = table.pivot_table(index=["batch", "nodes"], columns="network", values="efficiency")
    assert (wide["10Gbit/s"] >= wide["1Gbit/s"]).all()
    assert (wide.loc[(slice(None), slice(2, None)), "10Gbit/s"] > wide.loc[(slice(None), slice(2, None)),
                                                                           "1Gbit/s"]).all()
    for (_, _), group in table.groupby(["network", "batch"]):
        eff = group.sort_values("nodes")["efficiency"].to_numpy()
        assert eff[0] == 1.0 and (eff[1:] < eff[:-1]).all()
        # a larger per-worker batch has more compute to spread the same gradients over
    at10 = table[table["nodes"] == 10].pivot_table(index="batch", columns="network", values="efficiency")
    assert at10.index.tolist() == [32, 64, 96] and (at10.diff().dropna() > 0).all().all()


def test_one_prediction_by_hand():
    """Batch 32 at 200 images/s on 10 nodes of 10 Gbit/s, 30 us per ring step: compute
    32 / 200 = 0.16 s; ring allreduce of ResNet-50's 25,557,032 fp32 gradients,
    2 x 9 x 30e-6 + 2 x 9 / 10 x 102,228,128 B / 1.25e9 B/s = 0.14774 s, none hidden."""
    from guide_utils.perf.slices import prediction

    row = prediction({32: 200.0}, networks=("10Gbit/s",), nodes=(10,)).iloc[0]
    allreduce = 2 * 9 * 30e-6 + 2 * 9 / 10 * 25_557_032 * 4 / 1.25e9
    assert row["allreduce_s"] == pytest.approx(0.1477485, rel=1e-6) == pytest.approx(allreduce)
    assert row["efficiency"] == pytest.approx(0.16 / (0.16 + 0.1477485), rel=1e-6)
    assert row["images_per_second"] == pytest.approx(10 * 32 / (0.16 + 0.1477485), rel=1e-6)
    assert 0 < row["tts_efficiency"] <= 1


def test_the_thesis_rates_are_its_table_and_96_lies_between():
    from guide_utils.perf.slices import thesis_one_gpu_rates
    from guide_utils.results.sources import thesis_table

    table = thesis_table(1).set_index("per_worker_batch")["images_per_second"]
    rates = thesis_one_gpu_rates()
    assert rates[32] == table[32] and rates[64] == table[64]
    assert rates[96] == pytest.approx((table[64] + table[128]) / 2)
    with pytest.raises(GuideError, match="outside them: give your own rates"):
        thesis_one_gpu_rates((16, 32))
