"""guide_utils.runtime.launchers: each launcher's environment read from what it really exports.

The environments are the launchers' own, trimmed to the variables that matter: srun's and
Open MPI 4.1.4's mpirun were captured on the test Slurm (Slurm 22.05, two nodes,
tests/slurm_cluster.py), Open MPI's alone and torchrun's (PyTorch of requirements.lock) on
this machine, Horovod 0.28.1's horovodrun --gloo likewise; MPICH hydra's and jsrun's are
the variables their documentation names (no MPICH or LSF here).
"""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from guide_utils.core.errors import GuideError
from guide_utils.runtime import launchers, rendezvous
from guide_utils.runtime.launch import require_launcher, started_by

REPO = Path(__file__).resolve().parents[1]

# srun -N2 -n4 --ntasks-per-node=2, task 3 (salloc on the test Slurm).
SRUN_TASK = {
    "SLURMD_NODENAME": "guide-n2", "SLURM_CPUS_PER_TASK": "1", "SLURM_JOB_ID": "1",
    "SLURM_JOB_NODELIST": "guide-n[1-2]", "SLURM_JOB_NUM_NODES": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
    "SLURM_NPROCS": "4", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_PROCID": "3",
    "SLURM_STEPID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "guide-n[1-2]", "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_SUBMIT_DIR": "/work",
    "SLURM_TASKS_PER_NODE": "2(x2)",
}
# srun --mpi=pmix -n2 on one node, task 1.
SRUN_PMIX_TASK = {
    "PMIX_NAMESPACE": "slurm.pmix.2.0", "PMIX_RANK": "1", "SLURM_JOB_ID": "2", "SLURM_JOB_NODELIST": "guide-n1",
    "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_STEPID": "0",
    "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "guide-n1", "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2",
}
# mpirun -np 4 --map-by ppr:2:node in a 2-node allocation: rank 3. Its daemons run in an srun
# step of one task per node, whose SLURM_* variables the rank inherits (SLURM_PROCID=1: node 2's daemon).
MPIRUN_IN_SLURM = {
    "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1",
    "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_UNIVERSE_SIZE": "4", "PMIX_RANK": "3",
    "PMIX_NAMESPACE": "783351809", "SLURMD_NODENAME": "guide-n2", "SLURM_JOB_ID": "3",
    "SLURM_JOB_NODELIST": "guide-n[1-2]", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1", "SLURM_PROCID": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "guide-n[1-2]",
    "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_TASKS_PER_NODE": "1(x2)",
}
# mpirun -np 2 on this machine, rank 1.
MPIRUN_ALONE = {
    "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1",
    "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_UNIVERSE_SIZE": "2", "PMIX_RANK": "1",
    "PMIX_NAMESPACE": "1152843777",
}
# MPICH's and Intel MPI's hydra (mpiexec -n 8 -ppn 4): rank 6, on the second node.
HYDRA = {"PMI_RANK": "6", "PMI_SIZE": "8", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"}
# torchrun --standalone --nproc-per-node 2, rank 1.
TORCHRUN = {
    "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "localhost",
    "MASTER_PORT": "42499", "RANK": "1", "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "2", "TORCHELASTIC_MAX_RESTARTS": "0",
    "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_RUN_ID": "785eb65d-598c-4cad-aebe-c99d5a2a9153",
    "WORLD_SIZE": "2",
}
# horovodrun -np 2 -H localhost:2 --gloo --network-interface lo, rank 1.
HOROVODRUN = {"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_CROSS_RANK": "0",
              "HOROVOD_CROSS_SIZE": "1", "HOROVOD_GLOO_IFACE": "lo", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
              "HOROVOD_GLOO_RENDEZVOUS_PORT": "65365", "HOROVOD_HOSTNAME": "localhost", "HOROVOD_LOCAL_RANK": "1",
              "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}
# jsrun -n 4 -a 1 -g 1 on two compute nodes of 42 slots, rank 3 (LSF lists its launch node first).
JSRUN = {"JSM_NAMESPACE_RANK": "3", "JSM_NAMESPACE_SIZE": "4", "JSM_NAMESPACE_LOCAL_RANK": "1",
         "LSB_JOBID": "31337", "LSB_MCPU_HOSTS": "batch1 1 h41n04 42 h41n05 42", "LS_SUBCWD": "/ccs/proj/me"}


def _torchrun_in_srun_task(node: int) -> dict:
    """One torchrun per node (srun --ntasks-per-node=1 torchrun --nproc-per-node 2): local rank 1
    of node ``node``; the step's task is the node's, with the CPUs of both processes."""
    step = {**SRUN_TASK, "SLURM_PROCID": str(node), "SLURM_NODEID": str(node), "SLURM_LOCALID": "0",
            "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_CPUS_PER_TASK": "8",
            "CUDA_VISIBLE_DEVICES": "0,1"}
    return {**step, **TORCHRUN, "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": "2", "RANK": str(2 * node + 1),
            "WORLD_SIZE": "4", "MASTER_ADDR": "guide-n1", "MASTER_PORT": "20001"}


def answers(env) -> tuple:
    launcher = launchers.detect(env)
    return (launcher.name, launcher.rank, launcher.world_size, launcher.local_rank, launcher.local_size,
            launcher.node_rank)


# --- each launcher from its own environment ---------------------------------------------------

def test_srun_tasks():
    launcher = launchers.detect(SRUN_TASK)
    assert answers(SRUN_TASK) == ("srun", 3, 4, 1, 2, 1)
    assert launcher.main_address == "guide-n1" and launcher.cpus_asked() == 1
    assert launcher.can_start("ddp") and launcher.can_start("mwms") and not launcher.can_start("horovod")
    assert started_by(SRUN_TASK) == "srun"
    with pytest.raises(GuideError, match="srun started 4 tasks without an MPI plugin.*--mpi=pmix"):
        launchers.require("horovod", SRUN_TASK)


def test_srun_with_the_pmix_plugin_is_one_mpi_world():
    launcher = launchers.detect(SRUN_PMIX_TASK)
    assert answers(SRUN_PMIX_TASK) == ("srun", 1, 2, 1, 2, 0)
    assert launcher.mpi and launcher.prefers("horovod") and launcher.can_start("ddp")
    assert started_by(SRUN_PMIX_TASK) == "mpirun"  # as before: an MPI process manager, srun's plugin included
    assert require_launcher("horovod", SRUN_PMIX_TASK) == ("mpirun", launcher.job)


def test_mpirun_in_a_slurm_job_is_not_read_as_its_daemons_step():
    """Open MPI's ranks carry the SLURM_* variables of the step that runs its daemons: task 1
    there is node 2's daemon, not rank 3."""
    launcher = launchers.detect(MPIRUN_IN_SLURM)
    assert answers(MPIRUN_IN_SLURM) == ("mpirun", 3, 4, 1, 2, 1)
    assert launcher.main_address == "guide-n1"
    assert launcher.can_start("horovod") and not launcher.can_start("ddp")
    assert answers(MPIRUN_ALONE) == ("mpirun", 1, 2, 1, 2, 0)
    assert launchers.detect(MPIRUN_ALONE).main_address is None
    assert answers(HYDRA) == ("mpirun", 6, 8, 2, 4, 1)
    # hydra's proxies started by srun: PMI_RANK is not the proxy's task id
    assert launchers.detect({**HYDRA, "SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1"}).name == "mpirun"


def test_torchrun():
    launcher = launchers.detect(TORCHRUN)
    assert answers(TORCHRUN) == ("torchrun", 1, 2, 1, 2, 0)
    assert (launcher.main_address, launcher.main_port()) == ("localhost", 42499)
    assert launcher.torch_env() == {}  # torchrun set them all
    assert launcher.can_start("ddp") and not launcher.can_start("horovod")


def test_torchrun_per_node_under_srun():
    """SLURM_PROCID is the node's task under a launcher per node; the ranks are torchrun's,
    the task's CPUs are shared by the node's processes, the GPU is the node's by local rank."""
    env = _torchrun_in_srun_task(1)
    launcher = launchers.detect(env)
    assert answers(env) == ("srun-per-node", 3, 4, 1, 2, 1)
    assert launcher.started_by() == "torchrun" and launcher.backends == ("ddp",)
    assert launcher.cpus_asked() == 4  # 8 CPUs for the node's 2 processes
    assert (launcher.gpus(), launcher.gpu()) == (["0", "1"], "1")
    assert launcher.main_address == "guide-n1" and launcher.main_port() == 20001


def test_horovodrun_gloo():
    env = HOROVODRUN
    launcher = launchers.detect(env)
    assert answers(env) == ("horovodrun", 1, 2, 1, 2, 0)
    assert launcher.can_start("horovod") and not launcher.can_start("ddp")
    assert launcher.main_address == env["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
    # horovodrun inside an srun step: a launcher per node
    in_step = launchers.detect({**SRUN_TASK, **env})
    assert (in_step.name, in_step.started_by(), in_step.rank) == ("srun-per-node", "horovodrun", 1)


def test_jsrun():
    launcher = launchers.detect(JSRUN)
    assert (launcher.name, launcher.rank, launcher.world_size, launcher.local_rank) == ("jsrun", 3, 4, 1)
    assert launcher.hosts() == ["h41n04", "h41n05"] and launcher.main_address == "h41n04"
    assert launcher.local_size == 2 and launcher.node_rank == 1  # not on one of those hosts here: by rank
    assert launcher.job_id == 31337 and launcher.can_start("horovod") and launcher.can_start("ddp")
    # Spectrum MPI's variables beside jsrun's do not make it mpirun
    assert launchers.detect({**JSRUN, "OMPI_COMM_WORLD_RANK": "3", "PMIX_RANK": "3"}).name == "jsrun"
    assert started_by(JSRUN) == "mpirun"


def test_jsrun_is_one_module_and_nothing_else_names_it():
    """The proof that a launcher is one file plus its test: no other module of the package
    names the jsrun class or imports its module."""
    named = [p.relative_to(REPO) for p in (REPO / "src").rglob("*.py")
             if p.name != "jsrun.py" and ("Jsrun" in p.read_text() or "launchers.jsrun" in p.read_text())]
    assert named == []
    assert "jsrun" in launchers.names()


# --- the ambiguities --------------------------------------------------------------------------

def test_the_batch_shell_and_a_plain_process_have_no_launcher():
    batch = {k: v for k, v in SRUN_TASK.items() if not k.startswith("SLURM_STEP")}
    batch["SLURM_PROCID"] = "0"  # the batch script has task 0 too
    assert launchers.detect(batch) is None and launchers.detect({}) is None
    with pytest.raises(GuideError, match="started directly in the batch script of job 1"):
        launchers.require("ddp", batch)
    with pytest.raises(GuideError, match="needs a launcher: start it with srun or torchrun"):
        launchers.require("ddp", {})


def test_mpi_engines_running_ddp_are_torchrun_like():
    """ipyparallel's MPI engines get torchrun's variables for a DDP run (cluster.interactive)."""
    engine = {**MPIRUN_ALONE, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "n1",
              "MASTER_PORT": "2345"}
    assert answers(engine)[:3] == ("torchrun", 1, 2)


def test_a_launcher_that_cannot_start_the_backend_says_which_can():
    with pytest.raises(GuideError, match="--dist horovod cannot be started by torchrun; launch it with srun --mpi"):
        launchers.require("horovod", TORCHRUN)


def test_every_launcher_has_a_unique_name_and_the_registry_order_resolves_nesting():
    names = launchers.names()
    assert len(names) == len(set(names)) >= 6
    order = {n: i for i, n in enumerate(names)}
    assert order["srun-per-node"] < order["horovodrun"] < order["torchrun"] < order["srun"] < order["mpirun"]
    assert order["jsrun"] < order["mpirun"]


# --- the rendezvous port -----------------------------------------------------------------------

@pytest.fixture
def held_port():
    """A port of the derived range that another program listens on."""
    for port in range(rendezvous.PORT_BASE + 9000, rendezvous.PORT_BASE + rendezvous.PORT_SPAN):
        s = socket.socket()
        try:
            s.bind(("", port))
        except OSError:
            s.close()
            continue
        s.listen()
        yield port
        s.close()
        return
    pytest.skip("no free port in the rendezvous range")


def _task(rank: int, job_id: int, folder: Path, **extra) -> dict:
    return {**SRUN_TASK, "SLURM_PROCID": str(rank), "SLURM_JOB_ID": str(job_id), "GUIDE_RENDEZVOUS_DIR": str(folder),
            **extra}


def test_a_free_derived_port_is_used_and_every_rank_reads_the_same(tmp_path, held_port):
    job_id = held_port - rendezvous.PORT_BASE + 1  # the port after the held one: free (or skip)
    if not rendezvous.is_free(rendezvous.derived_port(job_id)):
        pytest.skip("the port after the held one is taken here")
    main, other = (launchers.detect(_task(r, job_id, tmp_path)) for r in (0, 3))
    port = main.main_port()
    assert port == rendezvous.derived_port(job_id) and other.main_port() == port
    assert main.torch_env()["MASTER_PORT"] == str(port) and main.torch_env()["MASTER_ADDR"] == "guide-n1"
    main.rendezvous_done()
    assert not list(tmp_path.iterdir()), "the main rank removes its announcement"


def test_a_held_derived_port_falls_back_to_a_free_one_that_every_rank_reads(tmp_path, held_port):
    job_id = held_port - rendezvous.PORT_BASE
    assert rendezvous.derived_port(job_id) == held_port and not rendezvous.is_free(held_port)
    main, other = (launchers.detect(_task(r, job_id, tmp_path)) for r in (0, 3))
    port = main.main_port()
    assert port != held_port and rendezvous.is_free(port)
    assert other.main_port() == port
    # the batch script's (or the user's) MASTER_PORT is used as it is: no check, no file
    mine = launchers.detect(_task(3, job_id, tmp_path / "none", MASTER_PORT="23456"))
    assert mine.main_port() == 23456 and not (tmp_path / "none").exists()


def test_a_rank_without_the_announcement_stops_with_one_line(tmp_path):
    with pytest.raises(GuideError, match="rank 0 announced no rendezvous port.*GUIDE_RENDEZVOUS_DIR"):
        rendezvous.agree(tmp_path / ".guide-rendezvous-x", 20001, is_main=False, wait_s=0.5)


def test_a_requeued_job_and_another_step_do_not_read_an_older_announcement(tmp_path):
    keys = {launchers.detect(_task(0, 5, tmp_path, **e)).rendezvous_key()
            for e in ({}, {"SLURM_RESTART_COUNT": "1"}, {"SLURM_STEP_ID": "1"})}
    assert len(keys) == 3


def test_the_rendezvous_command_checks_the_port_on_the_first_node(held_port):
    job_id = held_port - rendezvous.PORT_BASE
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}

    def run(node):
        env = {**clean, "SLURM_JOB_ID": str(job_id), "SLURM_JOB_NODELIST": "guide-n[1-2]", "SLURMD_NODENAME": node}
        out = subprocess.run([sys.executable, "-m", "guide_utils", "rendezvous"], capture_output=True, text=True,
                             env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        host, port = out.stdout.strip().rsplit(":", 1)
        return host, int(port)

    host, port = run("guide-n1")  # the batch script's node: the held port is refused
    assert host == "guide-n1" and port != held_port
    assert run("login1") == ("guide-n1", held_port)  # elsewhere it cannot be checked: the derived one


# --- the task probe reads the launcher's ranks ---------------------------------------------------

def test_the_task_probe_under_mpirun_reports_the_mpi_rank():
    """Under mpirun the probe used to read SLURM_PROCID, the daemon's task (rank 1 for ranks
    2 and 3), so doctor --tasks saw two ranks 1 on a node and none 2 or 3."""
    from guide_utils.cluster.doctor.tasks import probe

    assert [probe({**MPIRUN_IN_SLURM, "OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_RANK": str(r - 2)})
            ["rank"] for r in (2, 3)] == [2, 3]


# --- the command lines runtime.launch builds ------------------------------------------------------

def test_a_setup_starts_its_launcher_s_usual_backend():
    """perf.runs used to keep its own table of launcher names; the classes say it now."""
    from guide_utils.perf.runs import Setup, command

    [argv] = command(Setup("t", 2, "torchrun"), [], Path("r"))
    assert argv[argv.index("--dist") + 1] == "ddp"
    assert launchers.starting("horovod") == ["horovodrun", "mpirun"] and launchers.starting("ddp") == ["torchrun"]
    assert [launchers.backend_of(n) for n in ("horovodrun", "mpirun", "torchrun")] == ["horovod", "horovod", "ddp"]


def test_the_launcher_classes_parse_ranks_in_one_place():
    """No launcher module reads os.environ or converts a variable itself: base.Launcher's
    _read (runtime.slurm.read_int) does, so a new launcher declares variable names only."""
    for path in (REPO / "src" / "guide_utils" / "runtime" / "launchers").glob("*.py"):
        if path.name in ("base.py", "__init__.py"):
            continue
        tree = ast.parse(path.read_text())
        for call in ast.walk(tree):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "int":
                reads = [n for a in call.args for n in ast.walk(a)
                         if (isinstance(n, ast.Name) and n.id == "env")
                         or (isinstance(n, ast.Attribute) and n.attr == "env")]
                assert not reads, f"{path.name}:{call.lineno} parses a variable itself"
        assert "os.environ" not in path.read_text(), path.name



# --- the scheduler is not the launcher's: Slurm, LSF and PBS alike --------------------------------

# PBS Pro, job 4242 of the array 4242[] (subjob 3), two chunks of 2 MPI slots on x1001 and x1002.
PBS_JOB = {"PBS_JOBID": "4242[3].pbs01", "PBS_ARRAY_INDEX": "3", "PBS_O_WORKDIR": "/home/me/run"}
# The facts a scheduler owns: a launcher outside Slurm overrides none of them.
SCHEDULER_FACTS = {"job", "job_id", "rendezvous_key", "announce_file", "cpus_asked", "SUBMIT_DIR"}


@pytest.mark.parametrize("env, number", [
    ({"SLURM_JOB_ID": "5120337"}, 5120337), ({"SLURM_JOB_ID": "5120337_12"}, 5120337),
    ({"PBS_JOBID": "1234.server"}, 1234), ({"PBS_JOBID": "1234[5].pbs01.example.org"}, 1234),
    ({"PBS_JOBID": "1234[].pbs01"}, 1234), ({"LSB_JOBID": "31337"}, 31337), ({"LSB_JOBID": "31337[5]"}, 31337),
])
def test_one_reader_parses_every_scheduler_s_job_id(env, number):
    from guide_utils.runtime import schedulers
    from guide_utils.runtime.variables import read_int

    assert read_int(env, *env) == number and schedulers.detect(env).job_id == number
    # int() would read Slurm's 1234_5 as 12345; anything else is still one line naming it
    with pytest.raises(GuideError, match=r"PBS_JOBID='12a4\.x' is not an integer"):
        read_int({"PBS_JOBID": "12a4.x"}, "PBS_JOBID")


def test_each_scheduler_says_its_job_array_index_and_submission_directory(tmp_path):
    from guide_utils.runtime import schedulers

    nodefile = tmp_path / "nodes"
    nodefile.write_text("x1001\nx1001\nx1002\nx1002\n")
    pbs = schedulers.detect({**PBS_JOB, "PBS_NODEFILE": str(nodefile)})
    assert (pbs.name, pbs.job_id, pbs.array_index, pbs.submit_dir) == ("pbs", 4242, 3, "/home/me/run")
    assert (pbs.nodes, pbs.tasks, pbs.rendezvous_key()) == (["x1001", "x1002"], 4, "pbs4242.3")
    lsf = schedulers.detect(JSRUN)
    assert (lsf.name, lsf.job_id, lsf.submit_dir, lsf.rendezvous_key()) == ("lsf", 31337, "/ccs/proj/me", "lsf31337.0")
    slurm = schedulers.detect({**SRUN_TASK, "SLURM_ARRAY_TASK_ID": "7", "SLURM_RESTART_COUNT": "1"})
    assert (slurm.name, slurm.job_id, slurm.array_index, slurm.submit_dir) == ("slurm", 1, 7, "/work")
    assert (slurm.rendezvous_key(), slurm.cpus_per_task, slurm.node_index) == ("1.0.1", 1, 1)
    assert schedulers.detect({}) is None and schedulers.detect(TORCHRUN) is None


@pytest.fixture
def pals():
    """PBS Pro's PALS ``mpiexec`` as a contributor would add it (``launchers/pals.py``): its
    variables, ``detect`` and backends, nothing of the scheduler. Registered for the test only."""
    from guide_utils.runtime.launchers.base import Launcher

    class Pals(Launcher):
        name = "pals-mpiexec"
        priority = 45  # before mpirun: Cray PMI's PMI_RANK is set too
        scheduler_name = "pbs"
        backends = ("horovod", "ddp")
        RANK, SIZE = ("PALS_RANKID",), ("PMI_SIZE",)
        LOCAL_RANK, NODE_RANK = ("PALS_LOCAL_RANKID",), ("PALS_NODEID",)

        @classmethod
        def detect(cls, env):
            return "PALS_RANKID" in env

    yield Pals
    Launcher.registry.remove(Pals)


def test_a_launcher_under_pbs_needs_nothing_of_slurm(tmp_path, pals):
    """A PALS rank of a PBS job, no SLURM_* variable set: the job id (1234 of 1234.pbs01), the
    main node (PBS_NODEFILE's first), the rendezvous announced in PBS_O_WORKDIR all come from
    the PBS scheduler object; the class above overrides none of them."""
    nodefile = tmp_path / "nodes"
    nodefile.write_text("x1001\nx1001\nx1002\nx1002\n")
    env = {"PBS_JOBID": "1234.pbs01", "PBS_O_WORKDIR": str(tmp_path), "PBS_NODEFILE": str(nodefile),
           "PALS_RANKID": "0", "PALS_LOCAL_RANKID": "0", "PALS_NODEID": "0", "PMI_RANK": "0", "PMI_SIZE": "4"}
    launcher = launchers.detect(env)
    assert isinstance(launcher, pals) and not any(k.startswith("SLURM_") for k in env)
    assert (launcher.job_id, launcher.main_address, launcher.world_size) == (1234, "x1001", 4)
    assert launcher.announce_file() == tmp_path / ".guide-rendezvous-pbs1234.0"
    if rendezvous.is_free(rendezvous.derived_port(1234)):
        assert launcher.main_port() == rendezvous.derived_port(1234)
        assert launcher.announce_file().read_text().strip() == str(rendezvous.derived_port(1234))
        launcher.rendezvous_done()
    # Open MPI's or MPICH's mpirun in the same job finds the same job and main node, by the same object
    hydra = launchers.detect({**{k: env[k] for k in ("PBS_JOBID", "PBS_NODEFILE")}, **HYDRA})
    assert (hydra.name, hydra.job_id, hydra.main_address) == ("mpirun", 1234, "x1001")
    assert not SCHEDULER_FACTS & set(vars(pals))


def test_jsrun_under_lsf_overrides_no_scheduler_fact():
    """jsrun with LSF's variables only: its job id, announcement file and key are LSF's, and
    no launcher outside Slurm defines a scheduler's fact or reads a SLURM_* variable."""
    launcher = launchers.detect(JSRUN)
    assert launcher.scheduler.name == "lsf" and launcher.job is None
    assert (launcher.job_id, launcher.rendezvous_key()) == (31337, "lsf31337.0")
    assert launcher.announce_file().parent == Path("/ccs/proj/me")
    for cls in launchers.registered():
        if cls.scheduler_name != "slurm":
            assert not SCHEDULER_FACTS & set(vars(cls)), cls.name
            named = [v for k, vs in vars(cls).items() if k.isupper() and isinstance(vs, tuple) for v in vs]
            assert not [v for v in named if v.startswith("SLURM_")], cls.name


def test_the_no_launcher_message_is_built_from_the_registry(pals):
    """Every registered launcher that can start the backend is named, those of the job's own
    scheduler first (outside a job, Slurm's), the others with their scheduler."""
    with pytest.raises(GuideError, match=r"needs a launcher: start it with srun or torchrun \(.*pals-mpiexec under "
                                         r"PBS.*\), e\.g\. torchrun --nproc-per-node 2"):
        launchers.require("ddp", {})
    with pytest.raises(GuideError, match=r"batch script of job 1234 and would wait for ranks that never come; launch "
                                         r"it with pals-mpiexec or torchrun \(jsrun under LSF; srun under Slurm\)"):
        launchers.require("ddp", {"PBS_JOBID": "1234.pbs01"})
