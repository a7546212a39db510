"""guide_utils.runtime.slurm: the job context and the rendezvous derived from it."""

import re

import pytest

from guide_utils.runtime.slurm import PORT_BASE, PORT_SPAN, SlurmJob
from guide_utils.core.errors import GuideError

# The shape of the thesis's largest jobs (Appendix 3): 8 nodes x 4 P100, 7 CPUs per task.
THESIS_32_GPU = {
    "SLURM_JOB_ID": "5120337",
    "SLURM_JOB_NODELIST": "r01g[01-04],r02g[01-04]",
    "SLURM_NTASKS": "32",
    "SLURM_TASKS_PER_NODE": "4(x8)",
    "SLURM_CPUS_PER_TASK": "7",
    "SLURM_JOB_GRES": "gpu:p100:4",
    "SLURM_PROCID": "13",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "3",
}


def test_outside_a_job_there_is_none():
    assert SlurmJob.from_env({"HOME": "/root"}) is None


def test_thesis_shaped_job():
    job = SlurmJob.from_env(THESIS_32_GPU)
    assert job.nodes == [f"r01g0{i}" for i in range(1, 5)] + [f"r02g0{i}" for i in range(1, 5)]
    assert job.num_nodes == 8
    assert job.ntasks == 32
    assert job.tasks_per_node == [4] * 8
    assert job.cpus_per_task == 7
    assert job.gpus_per_node == 4
    assert (job.procid, job.localid, job.nodeid) == (13, 1, 3)


@pytest.mark.parametrize(
    "env, gpus",
    [
        ({"SLURM_GPUS_PER_NODE": "4"}, 4),
        ({"SLURM_GPUS_PER_NODE": "a100:8"}, 8),
        ({"SLURM_JOB_GRES": "gpu:v100:2"}, 2),
        ({"SLURM_JOB_GRES": "gpu:4(IDX:0-3)"}, 4),
        ({"SLURM_JOB_GRES": "gpu"}, 1),
        ({"SLURM_JOB_GRES": "nvme:1,gpu:a40:3"}, 3),
        ({}, None),
    ],
)
def test_gpu_request_syntaxes(env, gpus):
    job = SlurmJob.from_env({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1", **env})
    assert job.gpus_per_node == gpus


def test_uneven_tasks_per_node():
    job = SlurmJob.from_env({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "c[1-3]", "SLURM_TASKS_PER_NODE": "4(x2),2"})
    assert job.tasks_per_node == [4, 4, 2]
    assert job.ntasks == 10


def test_ntasks_per_node_applies_to_every_node():
    job = SlurmJob.from_env({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "c[1-3]", "SLURM_NTASKS_PER_NODE": "2"})
    assert job.tasks_per_node == [2, 2, 2]


def test_rendezvous_is_first_node_and_a_port_from_the_job_id():
    job = SlurmJob.from_env(THESIS_32_GPU)
    assert job.rendezvous() == ("r01g01", PORT_BASE + 5120337 % PORT_SPAN)
    assert job.master_port == 20337


def test_two_jobs_on_one_node_get_different_ports():
    ports = {SlurmJob.from_env({"SLURM_JOB_ID": str(j), "SLURM_JOB_NODELIST": "n1"}).master_port
             for j in range(1000, 1100)}
    assert len(ports) == 100
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)


# What srun adds in each task of a step (the batch script has none of these).
SRUN_TASK = {**THESIS_32_GPU, "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "32",
             "SLURM_STEP_NODELIST": "r01g[01-04],r02g[01-04]"}


def _task(tmp_path, **extra):
    """The launcher environment of an srun task whose rank 0 announced port 20337 (the
    derived one) in ``tmp_path``, as it does when nothing holds that port."""
    from guide_utils.runtime import launchers

    env = {**SRUN_TASK, "GUIDE_RENDEZVOUS_DIR": str(tmp_path), **extra}
    launcher = launchers.detect(env)
    launcher.announce_file().write_text("20337\n")
    return launcher


def test_torch_env_for_an_srun_task(tmp_path):
    env = _task(tmp_path).torch_env()
    assert env == {"MASTER_ADDR": "r01g01", "MASTER_PORT": "20337", "WORLD_SIZE": "32", "RANK": "13",
                   "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}


def test_torch_env_needs_an_srun_task():
    # The batch script itself has SLURM_PROCID=0 but is no task of a step.
    from guide_utils.runtime import launchers

    with pytest.raises(GuideError, match="batch script"):
        launchers.require("ddp", THESIS_32_GPU)


def test_a_step_smaller_than_the_job_is_its_own_world(tmp_path):
    env = _task(tmp_path, SLURM_STEP_NUM_TASKS="8", SLURM_STEP_NODELIST="r02g[01-02]", SLURM_PROCID="3").torch_env()
    assert (env["WORLD_SIZE"], env["MASTER_ADDR"], env["RANK"]) == ("8", "r02g01", "3")


@pytest.mark.parametrize("bad", [{"SLURM_NTASKS": "many"}, {"SLURM_TASKS_PER_NODE": "4(y2)"}])
def test_corrupt_values_are_named(bad):
    with pytest.raises(GuideError, match=re.escape(next(iter(bad.values())))):
        SlurmJob.from_env({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1", **bad})
