"""Every chapter notebook planned at the thesis's scale: papermill with ``-p profile full
-p dry_run True`` must print the thesis's configuration and run nothing."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.notebooks, pytest.mark.slow]

# What each chapter's full-scale plan must contain: the thesis's model, worker counts,
# global batches, learning rates and warmups (tables 1-15).
EXPECTED = {
    "01_single_gpu_baseline": ["resnet50 on synthetic; 1 worker(s) x 32 = global batch 32",
                               "1 worker(s) x 128 = global batch 128", "200 steps"],
    "02_single_node_data_parallel": ["4 worker(s) x 128 = global batch 512", "--workers=4",
                                     "DIST=ddp slurm_examples/submit.sh"],
    "03_multi_node_horovod": ["32 worker(s) x 128 = global batch 4096", "--workers=32"],
    "04_naive_scaling": ["32 worker(s) x 128 = global batch 4096; lr 0.1 (none rule)", "90 epoch(s)"],
    "05_linear_scaling_rule": ["32 worker(s) x 128 = global batch 4096; lr 1.6 (linear rule), no warmup"],
    "06_learning_rate_warmup": ["8 worker(s) x 128 = global batch 1024; lr 0.4 (linear rule), stepping warmup 5 epochs"],
    "07_per_worker_batch_size": ["32 worker(s) x 32 = global batch 1024; lr 0.4 (linear rule), stepping warmup 5"],
    # engines as a Slurm job: 8 of them, one per GPU, with the batch script the site profile gives
    "09_interactive_ipyparallel": ['EngineCluster(n=8, engines="slurm")', "resnet50 on synthetic; 8 worker(s) x 128 "
                                   "= global batch 1024; lr 0.4 (linear rule)", "#SBATCH --ntasks=8", "guide_software"],
    # the performance chapters: the sbatch jobs to run on the nodes, and the planner's answer
    "10_communication": ["10_communication.sbatch --nodes=8", "RUNTIME=torch"],
    # a floor on time-to-solution efficiency: the epoch overheads stop it at 2 nodes
    "11_scaling_model": ["--min-efficiency 0.9", "2 node(s), 8 GPU(s) x 128 = global batch 1024",
                         "learning rate 0.4 (linear scaling rule)", "time-to-solution efficiency 0.91"],
    "12_stepwise_tuning": ["12_stepwise_tuning.sbatch -- --channels-last",
                           "--channels-last --amp bf16 --compile"],
    "13_beyond_linear_scaling": ["06_learning_rate_warmup.sbatch --nodes=64 --array=0 -- --optimizer lars",
                                 "--optimizer lamb --lr-scaling sqrt", "global batch 8192"],
    "14_pitfalls": ["pitfalls 1 to 7 reproduced at laptop scale", "--kill-on-bad-exit=1"],
    "15_containers": ["--gpus-per-node=4", "apptainer_env.sh apptainer exec", "--cleanenv --nv -B"],
    # the walk's global batch on half the GPUs: the same batch, rate and steps per epoch
    "17_next_steps": ["32 worker(s) x 128 = global batch 4096\n", "16 worker(s) x 128 x 2 accumulation steps = "
                      "global batch 4096\n    peak lr 1.6 (linear rule), warmup gradual 5 epochs; 312 optimizer steps",
                      "nothing trained"],
    # the SLICES slides' grid at a playbook-built site: 10 one-GPU nodes, and ten 1-GPU jobs as an array
    "18_bring_your_own_cluster": ["Benchmark parameters; profile full, 33 run(s)",
                                  "03_multi_node_horovod.sbatch --workers=10 -- ",
                                  "01_single_gpu_baseline.sbatch --array=0-9 -- "],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_full_profile_dry_run_plans_the_thesis(name, tmp_path, monkeypatch):
    # papermill's own function in this process, as its command does it: one kernel per
    # notebook, without a papermill interpreter per notebook (4 CPU-s each).
    import papermill

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's temporary folders go with the test's

    out = tmp_path / f"{name}.ipynb"
    results = tmp_path / "results"
    parameters = {"profile": "full", "dry_run": True, "results_dir": str(results)}
    if name.startswith("03"):
        parameters["cluster_results"] = str(tmp_path / "no-cluster")
    papermill.execute_notebook(str(REPO / "notebooks" / f"{name}.ipynb"), str(out), parameters=parameters,
                               cwd=str(REPO / "notebooks"), progress_bar=False, execution_timeout=600)
    nb = nbformat.read(out, as_version=4)
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                     if o.output_type == "stream")
    for needle in EXPECTED[name]:
        assert needle in text, f"{name}: {needle!r} not in the plan:\n{text[:3000]}"
    assert "[train]" not in text, f"{name}: the dry run trained something"
    assert not results.exists() or not any(results.rglob("*.jsonl")), f"{name}: the dry run wrote run records"
