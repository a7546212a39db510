"""Every sbatch example, submitted to a real two-node Slurm started on this machine.

The CI site profile (slurm_examples/sites/ci.sh) runs the examples at smoke scale: CPUs,
a small ResNet, scikit-learn's digits packed as an image archive and staged to "node-local"
scratch like ImageNet would be. Each test checks what a user would: the job COMPLETED with
exit code 0 (or failed early, with the one line that says why), and the run records the
notebooks read are there with every epoch.

The jobs of all selected tests are submitted together at the start (``JOBS``, keyed by test
name) and run side by side; each test then waits for its own. Short epochs
(``--max-steps-per-epoch``) where a test checks the plumbing, not the training.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import slurm_cluster
import slurm_conf

from guide_utils.core.records import read_run
from slurm_cluster import SlurmCluster, start_or_skip
from slurm_conf import NODES
from slurm_sockets import LOOPBACK

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "slurm_examples"
SHORT = ("--max-steps-per-epoch", "6")  # every epoch's plumbing (records, resume, sync check), little compute
QUICK = ("--epochs", "2", *SHORT)
# A job warned after its first epoch: four short ones, so that the warning is acted on before
# the last (the ranks look at it when an epoch's steps end; one that comes during the last
# epoch lets the run finish instead of stopping it, and the warning step takes seconds to start).
WARNED = ("--epochs", "4", *SHORT)

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.multiprocess]


cluster = pytest.fixture(scope="module", name="cluster")(slurm_cluster.module_cluster)
SAMPLE_LISTENERS = True  # test_jobs_listen_on_loopback_where_it_can_be_configured reads them


archive = pytest.fixture(scope="module", name="archive")(slurm_cluster.digits_archive)


@dataclass
class Job:
    """One test's submission. ``via``: submit.sh, chain.sh (2 jobs of 1 epoch) or plain
    sbatch (``script`` may then be a file the test writes, see ``direct_launch``)."""

    script: str
    sbatch: tuple[str, ...] = ()
    train: tuple[str, ...] = QUICK
    env: dict[str, str] = field(default_factory=dict)
    via: str = "submit"
    broken_horovod: bool = False  # a horovod package that raises ImportError, first on PYTHONPATH
    comma_path: bool = False  # submit through a path to the repository that contains a comma
    full_scratch: bool = False  # GUIDE_CI_SCRATCH is a 512 KiB tmpfs
    usr1_after_epoch: bool = False  # scancel --signal=USR1 --batch once the first epoch is logged
    first_epoch: str = r"^\[train\] epoch 1/"  # how the log says so (the engine's line by default)
    site: str | None = "ci"  # None: GUIDE_SITE unset; "incomplete": ci.sh without its GUIDE_SCRATCH line
    profile: str = ""  # lines added at the end of (a copy of) the CI profile
    like: str | None = None  # a shipped site profile whose GPU request and srun options the job uses
    full_doctor: bool = False  # GUIDE_DOCTOR=full: the job's doctor probes the frameworks (else --quick)
    until_cancelled: bool = False  # runs until its test cancels it: no other test waits for it
    watch_steps: bool = False  # record the job's steps (scontrol show step) while it runs


# Batch scripts the tests write. direct_*: one that runs the training itself, no launcher.
DIRECT = """#!/bin/bash
#SBATCH --job-name=direct_{dist}
exec "{python}" -m guide_utils.train --profile smoke --dist {dist} --epochs 1 --results-dir "{results}"
"""
# The per-task check (task-probe | doctor --tasks) on steps laid out as a site would, bare:
# each step's report and exit status, between markers, in the log.
PROBES = """#!/bin/bash
#SBATCH --job-name={name}
{sbatch}
check() {{
    echo "== check: $1"; shift
    srun "$@" "{python}" -m guide_utils task-probe | "{python}" -m guide_utils doctor --tasks -
    echo "== status $?"
}}
{steps}
"""
BINDING = {
    # Two nodes, one task of two CPUs each. srun on Slurm 22.05-23.02 does not take the job's
    # --cpus-per-task: with per-task binding (--cpu-bind=cores) a task gets one CPU, unless
    # SRUN_CPUS_PER_TASK is exported (what guide.sh does in every job).
    "probes_cpus": ("#SBATCH --nodes=2 --ntasks-per-node=1 --cpus-per-task=2", """
check "cpus without SRUN_CPUS_PER_TASK" --cpu-bind=cores
export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
check "cpus with SRUN_CPUS_PER_TASK" --cpu-bind=cores
"""),
    # Two tasks and two fake GPUs on one node: Slurm's GRES plugin sets CUDA_VISIBLE_DEVICES
    # per step (all of the step's GPUs) or per task (--gpus-per-task); the ranks must not share.
    "probes_gpus": ("#SBATCH --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --gres=gpu:2", """
check "per-node gpus"
check "per-task gpus" --gpus-per-task=1
check "one gpu for two ranks" --gres=gpu:1
echo "== check: doctor in a gpu step"
srun --ntasks=1 "{python}" -m guide_utils doctor --framework pytorch --dist ddp --profile smoke
echo "== status $?"
"""),
}


def site_step(site: str) -> str:
    """The srun options of a training step of two tasks on one node at ``site``, on the test
    Slurm: the profile's GPU request (its GPU type and other GRES left out: the fake GPUs have
    no type) and its srun options, CPU masks moved to this machine's first CPUs (the profile's
    name CPUs up to 63). Within a job, srun takes the per-task request from the job's
    environment (SLURM_GPUS_PER_TASK); here the step names it."""
    out = subprocess.run(["bash", "-c", 'set +u; source "$1" >/dev/null 2>&1; printf "%s\\n" "$GUIDE_GPU_REQUEST" '
                          '${GUIDE_SRUN_ARGS[@]+"${GUIDE_SRUN_ARGS[@]}"}', "site", str(EXAMPLES / f"sites/{site}.sh")],
                         capture_output=True, text=True, env={**os.environ, "GUIDE_ROOT": str(REPO)}, check=True)
    request, *srun = out.stdout.splitlines()
    request = re.sub(r",[A-Za-z_]+:\d+", "", re.sub(r"gpu:[A-Za-z0-9_]+:", "gpu:", request)).replace("%d", "2")
    srun = [re.sub(r"mask_cpu:\S+", "mask_cpu:0x1,0x2", opt) for opt in srun]
    return " ".join(shlex.quote(o) for o in ["-N1", "-n2", "-c1", request, *srun] if o)


# Every shipped site profile's GPU request and binding, through the per-task check in one job.
SITES = sorted(p.stem for p in EXAMPLES.glob("sites/*.sh") if p.stem not in ("TEMPLATE", "ci"))
BINDING["probes_sites"] = ("#SBATCH --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --gres=gpu:2",
                           "".join(f'check "{site}" {site_step(site)}\n' for site in SITES))

ARRAYS = {
    "04_naive_scaling.sbatch": [(32, "none", "none"), (64, "none", "none"), (128, "none", "none")],
    "05_linear_scaling_rule.sbatch": [(32, "linear", "none"), (64, "linear", "none"), (128, "linear", "none")],
    "06_learning_rate_warmup.sbatch": [(32, "linear", "stepping"), (64, "linear", "stepping"),
                                       (128, "linear", "stepping")],
    "07_per_worker_batch_size.sbatch": [(32, "linear", "stepping"), (128, "linear", "stepping")],
}
MULTI_NODE = [("srun", "horovod"), ("mpirun", "horovod"), ("torchrun", "ddp"), ("srun-ddp", "ddp")]
TENSORFLOW = [("08_tensorflow_horovod.sbatch", "horovod", (), 4),
              ("08_tensorflow_native.sbatch", "mwms", ("--nodes=1",), 2)]

# Every job, by the name of the test that checks it, in the order they are submitted: the
# ones that fail at once, then the longest chains (requeue, dependency), then the rest. The
# DDP and TensorFlow-native jobs run with a broken Horovod: they do not need it, and neither
# must their doctor. The jobs whose tests read the doctor's verdict run the full doctor; the
# others its quick form (the CI profile's), which probes no framework.
JOBS: dict[str, Job] = {
    **{f"test_dist_started_in_the_batch_script_fails_at_once[{dist}]": Job(f"direct_{dist}", via="sbatch")
       for dist in ("horovod", "ddp")},
    "test_a_job_without_guide_site_stops_at_its_first_line":
        Job("01_single_gpu_baseline.sbatch", via="sbatch", site=None),
    "test_an_incomplete_site_profile_stops_before_anything_runs":
        Job("01_single_gpu_baseline.sbatch", via="sbatch", site="incomplete"),
    "test_a_full_scratch_disk_fails_the_job_at_staging": Job("01_single_gpu_baseline.sbatch", full_scratch=True),
    "test_a_horovod_job_without_horovod_stops_at_the_doctor":
        Job("03_multi_node_horovod.sbatch", env={"LAUNCHER": "srun"}, broken_horovod=True, full_doctor=True),
    "test_single_gpu_baseline_requeues_when_warned_and_finishes":
        Job("01_single_gpu_baseline.sbatch", train=("--epochs", "3", "--max-steps-per-epoch", "20"),
            usr1_after_epoch=True),
    "test_dependency_chain_resumes_from_the_previous_jobs_checkpoint":
        Job("01_single_gpu_baseline.sbatch", via="chain", train=SHORT),
    **{f"test_tensorflow[{dist}]": Job(script, sbatch=sbatch, broken_horovod=dist == "mwms", full_doctor=dist == "mwms")
       for script, dist, sbatch, _ in TENSORFLOW},
    # torchrun is warned like 01 (USR1 to the batch shell): its workers must still checkpoint.
    **{f"test_multi_node[{launcher}]": Job("03_multi_node_horovod.sbatch", env={"LAUNCHER": launcher},
                                           train=WARNED if launcher == "torchrun" else QUICK,
                                           broken_horovod=dist == "ddp", full_doctor=True,
                                           usr1_after_epoch=launcher == "torchrun", watch_steps=launcher == "mpirun")
       for launcher, dist in MULTI_NODE},
    # horovodrun and torchrun are warned like 01: the signal must reach their workers, not them.
    "test_one_node_data_parallel[horovod]": Job("02_single_node_data_parallel.sbatch", env={"DIST": "horovod"},
                                                 train=WARNED, comma_path=True, usr1_after_epoch=True,
                                                 first_epoch=r"^\[0\]<stdout>:\[train\] epoch 1/"),  # horovodrun's prefix
    "test_one_node_data_parallel[ddp]": Job("02_single_node_data_parallel.sbatch", env={"DIST": "ddp"}, train=WARNED,
                                             broken_horovod=True, full_doctor=True, usr1_after_epoch=True),
    # Binding: the per-task check on bare steps, and a job whose site binds tasks to cores.
    **{f"test_{name}": Job(name, via="sbatch") for name in ("probes_cpus", "probes_gpus", "probes_sites")},
    "test_each_task_gets_the_cpus_the_job_asked_for":
        Job("01_single_gpu_baseline.sbatch", train=("--epochs", "1", *SHORT),
            profile="GUIDE_TASKS_PER_NODE=1 GUIDE_CPUS_PER_TASK=2 GUIDE_SRUN_ARGS=(--cpu-bind=cores)\n"),
    # Sites' GPU syntax on the test Slurm's fake GPUs (the training itself runs on the CPUs):
    # Puhti's per-node GRES under one torchrun per node. (Perlmutter's per-task GPUs under srun,
    # one torchrun per node and horovodrun: the warned jobs of test_your_own_script.)
    "test_a_site_profile_runs_on_fake_gpus[puhti-like]":
        Job("03_multi_node_horovod.sbatch", env={"LAUNCHER": "torchrun"}, like="puhti-like", broken_horovod=True),
    # TensorFlow given GPUs it cannot use (the lock's tensorflow-cpu, on the fake GPUs): the doctor
    # stops it, as it stops a PyTorch that sees none (test_probes_gpus).
    "test_a_tensorflow_job_given_gpus_it_cannot_use_stops_at_the_doctor":
        Job("08_tensorflow_native.sbatch", sbatch=("--nodes=1",), like="puhti-like", broken_horovod=True,
            full_doctor=True),
    # The arrays run on one node, one worker per array task: what they add to 03 is the array,
    # one run per array task (several workers per job, the srun --mpi line, both nodes: 03's).
    # Two tasks of each array (the first and the last: --array on the command line overrides
    # the script's), enough to show that the task id picks the run.
    # 05 runs DDP (DIST=ddp) with a broken Horovod: no script needs Horovod.
    **{f"test_job_array_writes_one_record_per_task[{script[:2]}]":
       Job(script, sbatch=("--nodes=1", f"--array=0,{len(tasks) - 1}"), train=("--epochs", "1", *SHORT),
           profile="GUIDE_TASKS_PER_NODE=1\n",
           env={"DIST": "ddp"} if script.startswith("05") else {}, broken_horovod=script.startswith("05"))
       for script, tasks in ARRAYS.items()},
}


# Staging and chains (issue 23): a chain whose first link fails after staging (a mistyped
# model), and a job that stages on both nodes and then waits for the test to cancel it.
JOBS["test_a_failed_link_cancels_the_rest_of_the_chain"] = Job("01_single_gpu_baseline.sbatch", via="chain",
                                                               train=("--model", "no_such_model"))
JOBS["test_staging_is_the_jobs_own_and_goes_when_it_is_cancelled"] = Job(
    str(REPO / "tests" / "data" / "stage_then_wait.sbatch"), via="sbatch", until_cancelled=True)


class Submission:
    """Where one test's jobs write (results, logs, checkpoints, scratch), its job ids, and
    how it was submitted."""

    def __init__(self, cluster: SlurmCluster, tmp: Path, archive: Path, job: Job):
        self.cluster, self.tmp, self.job = cluster, tmp, job
        tmp.mkdir(parents=True, exist_ok=True)
        self.results, self.logs, self.scratch = tmp / "results", tmp / "logs", tmp / "scratch"
        pythonpath = [str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
        if job.broken_horovod:
            broken = tmp / "broken-horovod"
            (broken / "horovod").mkdir(parents=True)
            (broken / "horovod" / "__init__.py").write_text(
                'raise ImportError("this horovod is broken on purpose (test_slurm_examples.py)")\n')
            pythonpath.insert(0, str(broken))
        self.env = {**{k: v for k, v in cluster.env.items() if k not in ("GUIDE_SITE", "GUIDE_ROOT")},
                    "GUIDE_DATASET_ARCHIVE": str(archive), "GUIDE_RESULTS_DIR": str(self.results),
                    "GUIDE_LOG_DIR": str(self.logs), "GUIDE_CHECKPOINT_ROOT": str(tmp / "checkpoints"),
                    "GUIDE_CI_SCRATCH": str(self.scratch), "PYTHONPATH": os.pathsep.join(pythonpath),
                    "GUIDE_DOCTOR": "full" if job.full_doctor else "quick", **job.env}
        if job.site == "incomplete":
            incomplete = tmp / "incomplete-site.sh"
            incomplete.write_text("".join(line for line in (EXAMPLES / "sites/ci.sh").read_text().splitlines(True)
                                          if not line.startswith("GUIDE_SCRATCH=")))
            self.env["GUIDE_SITE"] = str(incomplete)
        elif job.profile or job.like:
            self.env["GUIDE_SITE"] = str(self._profile(job))
        elif job.site:
            self.env["GUIDE_SITE"] = job.site
        self.repo = REPO
        if job.comma_path:
            (tmp / "a,b").mkdir()
            (tmp / "a,b" / "repo").symlink_to(REPO)
            self.repo = tmp / "a,b" / "repo"
        self.ids: list[str] = []
        self.usr1_sent = False
        self.steps: dict[str, str] = {}  # step id -> its `scontrol show step -o` line, last seen

    def _profile(self, job: Job) -> Path:
        """The CI profile with the test's changes: ``profile`` lines, and for ``like`` the named
        site's GPU request (GPU type and other GRES left out: the test Slurm's fake GPUs have
        no type) and srun options, on the test Slurm's CPUs."""
        text = (EXAMPLES / "sites/ci.sh").read_text()
        if job.like:
            site = f'set +u; source "$GUIDE_ROOT/slurm_examples/sites/{job.like}.sh" >/dev/null'
            text = f"""\
# {job.like}'s GPU request and srun options, read in a subshell: nothing else of that site
# (its paths, modules, exports) applies here. -g: this file is sourced inside a function.
site_gpus=$({site}; sed -E 's/gpu:[[:alnum:]_]+:/gpu:/; s/,[[:alnum:]_]+:[0-9]+//g' <<<"$GUIDE_GPU_REQUEST")
site_srun=$({site}; declare -p GUIDE_SRUN_ARGS 2>/dev/null || echo "declare -a GUIDE_SRUN_ARGS=()")
{text}
GUIDE_GPU_REQUEST=$site_gpus
eval "${{site_srun/declare -a/declare -ga}}"
"""
        path = self.tmp / "site.sh"
        path.write_text(text + job.profile)
        return path

    def submit(self) -> None:
        job, examples = self.job, self.repo / "slurm_examples"
        self.submitted_at = time.monotonic()
        if job.via == "submit":
            out = self._run([str(examples / "submit.sh"), str(examples / job.script), "--parsable", *job.sbatch,
                             "--", *job.train])
            self.ids = [out.split(";")[0]]
        elif job.via == "chain":
            out = self._run([str(examples / "chain.sh"), "2", "1", str(examples / job.script), *job.sbatch,
                             "--", *job.train])
            self.ids = re.findall(r"job \d+/2: (\d+)", out)
            assert len(self.ids) == 2, out
        else:
            script = examples / job.script
            python = REPO / ".venv/bin/python"
            if job.script.startswith("direct_"):
                script = self.tmp / f"{job.script}.sbatch"
                script.write_text(DIRECT.format(dist=job.script.split("_")[1], python=python, results=self.results))
            elif job.script in BINDING:
                script = self.tmp / f"{job.script}.sbatch"
                sbatch, steps = BINDING[job.script]
                script.write_text(PROBES.format(name=job.script, sbatch=sbatch, python=python,
                                                steps=steps.format(python=python)))
            self.logs.mkdir()
            self.ids = [self._run(["sbatch", "--parsable", f"--output={self.logs}/%x-%j.out", str(script)])]

    def _run(self, argv: list[str]) -> str:
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True, cwd=self.repo)
        assert out.returncode == 0, f"{argv}: {out.stderr}"
        return out.stdout.strip()

    def log(self, tail: int | None = None) -> str:
        """Every job log of this test, whole or (for failure messages) the last characters."""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-tail if tail else 0:]}"
                         for p in sorted(self.logs.glob("*.out")))

    def wait(self, timeout: float = 600) -> list[dict]:
        return [r for job_id in self.ids for r in self.cluster.wait(job_id, timeout)]

    def wait_completed(self, timeout: float = 600) -> list[dict]:
        records = self.wait(timeout)
        states = [(r.get("JobId"), r.get("ArrayTaskId"), r["JobState"], r["ExitCode"]) for r in records]
        assert all(r["JobState"] == "COMPLETED" and r["ExitCode"] == "0:0" for r in records), \
            f"{states}\n{self.log(3000)}{self.cluster.memory_note()}"
        return records

    def wait_failed_at_start(self, timeout: float = 300) -> str:
        """Wait for a job that must fail with exit code 2 before it trains; its log."""
        (record,) = self.wait(timeout)
        assert (record["JobState"], record["ExitCode"]) == ("FAILED", "2:0"), f"{record}\n{self.log(3000)}"
        assert not self.results.exists(), "a job that must fail before training wrote run records"
        log = self.log()
        assert "Traceback" not in log and "[train]" not in log, log[-3000:]
        return log

    def runs(self):
        return [read_run(p) for p in sorted(self.results.glob("*.jsonl"))]


class Batch:
    """The jobs of every selected test, submitted up front."""

    def __init__(self, cluster: SlurmCluster, archive: Path, base: Path, names: list[str]):
        self.cluster, self.archive, self.subs, self.threads = cluster, archive, {}, []
        self.stack = contextlib.ExitStack()
        try:
            for name in names:
                self._submit(name, base / re.sub(r"\W", "_", name))
        except BaseException:
            self.close()
            raise

    def _submit(self, name: str, tmp: Path) -> Submission:
        job = JOBS[name]
        sub = Submission(self.cluster, tmp, self.archive, job)
        if job.full_scratch:
            self.stack.enter_context(self.cluster.tmpfs(sub.scratch, "512k"))
        sub.submit()
        sub.again = lambda: self._again(name, sub)
        self.subs[name] = sub
        if job.usr1_after_epoch:
            t = threading.Thread(target=self._usr1_after_first_epoch, args=(sub,), daemon=True)
            t.start()
            self.threads.append(t)
        if job.watch_steps:
            t = threading.Thread(target=self._watch_steps, args=(sub,), daemon=True)
            t.start()
            self.threads.append(t)
        return sub

    def get(self, name: str) -> Submission:
        assert name in self.subs, f"{name} has no entry in JOBS"
        return self.subs[name]

    def _usr1_after_first_epoch(self, sub: Submission) -> None:
        """What Slurm's --signal=B:USR1@T does at the time limit, as soon as an epoch is
        done, instead of waiting for a short limit to come near."""
        (job_id,) = sub.ids
        end = time.monotonic() + 1500  # from submission: the job may queue behind the module's others
        polls = 0
        # The log is read every 0.3 s; Slurm is asked whether the job ended every 3 s only: a
        # scontrol process per poll, for minutes of queueing, was most of the module's calls.
        while time.monotonic() < end and (polls % 10 or self.cluster.finished(job_id) is None):
            if re.search(sub.job.first_epoch, sub.log(), re.M):
                subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=self.cluster.env,
                               capture_output=True)
                sub.usr1_sent = True
                return
            polls += 1
            time.sleep(0.3)

    def _watch_steps(self, sub: Submission) -> None:
        """What each step of the job was given (CPUs, TRES), as scontrol shows it while it runs:
        there is no accounting database to ask afterwards."""
        (job_id,) = sub.ids
        end = time.monotonic() + 1500
        polls = 0  # whether the job ended: every 3 s (see _usr1_after_first_epoch)
        while time.monotonic() < end and (polls % 6 or self.cluster.finished(job_id) is None):
            out = subprocess.run(["scontrol", "show", "step", "-o", job_id], env=self.cluster.env,
                                 capture_output=True, text=True)
            for line in out.stdout.splitlines():
                step = re.match(r"StepId=(\S+)", line)
                if step:
                    sub.steps[step.group(1)] = line
            polls += 1
            time.sleep(0.5)

    def _again(self, name: str, first: Submission) -> Submission:
        """A second submission in a folder of its own, for a test whose first one a dying
        Slurm daemon broke (tests/slurm_rerun.py); what is left of the first is cancelled."""
        self._cancel(first)
        return self._submit(name, first.tmp.with_name(first.tmp.name + "_again"))

    def _cancel(self, sub: Submission) -> None:
        for job_id in sub.ids:
            if self.cluster.finished(job_id) is None:
                subprocess.run(["scancel", job_id], env=self.cluster.env, capture_output=True)

    def close(self) -> None:
        for sub in self.subs.values():
            self._cancel(sub)
        for sub in self.subs.values():
            with contextlib.suppress(TimeoutError):
                sub.wait(60)
        self.stack.close()  # unmount the full scratch disk, also when a test failed


@pytest.fixture(scope="module")
def batch(request, cluster, archive, tmp_path_factory):
    here = Path(__file__)
    selected = {item.name for item in request.session.items if Path(item.fspath) == here}
    names = [name for name in JOBS if name in selected]
    b = Batch(cluster, archive, tmp_path_factory.mktemp("jobs"), names)
    yield b
    b.close()


@pytest.fixture
def jobs(batch, request) -> Submission:
    return batch.get(request.node.name)


def _warned(jobs: Submission) -> str:
    """The job was warned while it trained, and each node's warning step signalled at least
    one training process (it prints how many); the job's log."""
    log = jobs.log()
    assert jobs.usr1_sent, f"the job finished before it could be warned\n{log[-3000:]}"
    sent = [int(n) for n in re.findall(r"^== [\w.-]+: USR1 sent to (\d+) training process\(es\)$", log, re.M)]
    assert sent and min(sent) >= 1, f"the warning reached no training process\n{log[-3000:]}"
    return log


def _requeued_and_resumed(jobs: Submission, records: list[dict], run) -> None:
    """Warned once (USR1 after the first epoch): the training processes checkpointed, the job
    requeued itself and the next start resumed, in one run record."""
    log = _warned(jobs)
    assert all(int(r["Restarts"]) >= 1 for r in records), f"the job was never requeued\n{log[-3000:]}"
    assert "== USR1: time limit near" in log and "requeueing job" in log and "== restart 1 (requeued)" in log, \
        log[-3000:]
    assert [e for e in run.events if e["type"] == "resume"], "no resume recorded"
    # The training processes got the warning and saved mid-epoch; a launcher that got it too
    # (torchrun, horovodrun: no handler) dies of it, 128 + 10, with its workers' checkpoint.
    assert [e for e in run.events if e["type"] == "preempted"], f"no checkpoint on the signal\n{log[-3000:]}"
    ended = re.findall(r"^== launch ended with status (\d+) after the warning$", log, re.M)
    assert ended and "138" not in ended, log[-3000:]


def _epochs(job: Job) -> int:
    return int(job.train[job.train.index("--epochs") + 1])


def _finished(run, epochs: int = 2) -> None:
    assert run.epochs["epoch"].tolist() == list(range(1, epochs + 1)), run.path
    assert run.summary is not None and run.summary["completed_epochs"] == epochs, run.path
    assert run.summary["ranks_agree"], run.summary  # every worker ended with the same weights


# -- The cluster itself ------------------------------------------------------------------------

def test_the_daemons_listen_on_loopback_only(cluster):
    """slurmctld and both slurmd listen on 127.0.0.1 only: the test Slurm shares this host's
    network, and nothing on it must be reachable from outside."""
    daemons = [s for s in cluster.listening_sockets() if s[0] in ("slurmctld", "slurmd")]
    assert sorted({s[0] for s in daemons}) == ["slurmctld", "slurmd"] and len({s[1] for s in daemons}) == 3, daemons
    assert all(addr in LOOPBACK for _, _, addr, _ in daemons), daemons


def test_the_node_names_resolve_for_jobs_but_etc_hosts_is_untouched(cluster):
    hosts = Path("/etc/hosts").read_text()
    assert not any(n in hosts for n in NODES), "the test Slurm edited /etc/hosts"
    out = cluster.in_namespace("getent", "hosts", *NODES)
    assert [line.split()[0] for line in out.stdout.splitlines()] == ["127.0.0.1"] * len(NODES), out.stdout


def test_concurrent_test_slurms_derive_disjoint_ports_from_their_job_ids(monkeypatch):
    """Up to four pytest-xdist workers each run a test Slurm at once: the ports derived from
    their job ids (rendezvous at 20000 + id % 10000, TensorFlow's from 1000 above it) must not
    meet while each cluster runs fewer than 1000 jobs."""
    ports = []
    for worker in ("gw0", "gw1", "gw2", "gw3"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        first = slurm_conf.first_job_id()
        ids = range(first, first + 1000)
        ports.append({20000 + i % 10000 for i in ids} | {21000 + i % 10000 for i in ids})
    assert all(not (a & b) for k, a in enumerate(ports) for b in ports[k + 1:])


def _fake(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / name).chmod(0o755)


@pytest.mark.parametrize("daemon, body, message", [
    ("slurmctld", 'echo "fatal: cannot bind (a fake slurmctld)"; exit 1', "slurmctld exited at start (status 1)"),
    ("slurmd", 'echo "a fake slurmd that never registers"; exec sleep 300',
     "the nodes did not come up idle within 3 s"),
], ids=["slurmctld-exits", "nodes-never-up"])
def test_a_slurm_that_does_not_start_fails_with_its_logs(tmp_path, daemon, body, message):
    """Only 'cannot host Slurm here' may skip: a daemon that dies or nodes that never come
    up fail the tests, and the failure shows the daemons' logs."""
    c = SlurmCluster(tmp_path / "slurm")
    _fake(tmp_path / "bin", daemon, body)
    c.env["PATH"] = f"{tmp_path / 'bin'}:{c.env['PATH']}"
    c.node_timeout = 3
    with pytest.raises(pytest.fail.Exception) as failed:
        start_or_skip(c)
    text = str(failed.value)
    assert text.startswith("the test Slurm did not start: " + message), text
    assert ("fatal: cannot bind" if daemon == "slurmctld" else "never registers") in text  # the log's tail
    assert c.holder is None and not c.procs  # everything it started was stopped


def test_only_a_machine_that_cannot_host_slurm_skips(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        start_or_skip(SlurmCluster(tmp_path))


# -- The examples ------------------------------------------------------------------------------

def test_single_gpu_baseline_requeues_when_warned_and_finishes(jobs):
    """Slurm's time-limit warning (USR1 to the batch shell, as --signal=B:USR1@600 sends it)
    arrives after the first epoch: the run must checkpoint, requeue itself, resume and
    still end with every epoch."""
    (record,) = jobs.wait_completed()
    log = _warned(jobs)
    assert int(record["Restarts"]) >= 1, f"the job was never requeued\n{log[-3000:]}"
    assert "== USR1: time limit near" in log and "requeueing job" in log and "== restart 1 (requeued)" in log
    assert "stack usable: not checked (--quick) (for --framework pytorch --dist none)" in log  # GUIDE_DOCTOR=quick
    (run,) = jobs.runs()  # one record, continued across restarts
    _finished(run, 3)
    assert [e for e in run.events if e["type"] == "resume"], "no resume recorded"
    assert run.environment["workers"] == 1


def test_dependency_chain_resumes_from_the_previous_jobs_checkpoint(jobs):
    jobs.wait_completed()
    (run,) = jobs.runs()
    _finished(run, 2)
    assert "resuming checkpoint-epoch0001.pt at epoch 1" in jobs.log()


@pytest.mark.parametrize("dist", ["horovod", "ddp"])
def test_one_node_data_parallel(jobs, dist):
    """DDP runs where Horovod is broken (the doctor checks what the job uses); the Horovod
    job is submitted through a repository path with a comma (GUIDE_ROOT is exported, not
    passed in --export=ALL,NAME=value, where a comma splits it)."""
    records = jobs.wait_completed()
    (run,) = jobs.runs()
    _finished(run, _epochs(jobs.job))
    assert (run.config["dist"], run.environment["workers"]) == (dist, 2)
    if jobs.job.usr1_after_epoch:
        _requeued_and_resumed(jobs, records, run)
    if jobs.job.comma_path:
        assert f"== site ci ({jobs.repo}/slurm_examples/sites/ci.sh)" in jobs.log()


@pytest.mark.parametrize("launcher", [launcher for launcher, _ in MULTI_NODE])
def test_multi_node(jobs, launcher):
    dist = dict(MULTI_NODE)[launcher]
    records = jobs.wait_completed()
    (run,) = jobs.runs()
    _finished(run, _epochs(jobs.job))
    if jobs.job.usr1_after_epoch:
        _requeued_and_resumed(jobs, records, run)
    assert (run.config["dist"], run.environment["workers"]) == (dist, 4)
    assert sorted(run.environment["slurm"]["nodes"]) == list(NODES)
    log = jobs.log()  # the job printed its configuration and the doctor's report before staging
    assert log.index("== site ci") < log.index(f"stack usable: yes (for --framework pytorch --dist {dist})") \
        < log.index("== staging")
    if dist == "ddp":
        assert re.search(r"^horovod +not checked \(not used by --framework pytorch --dist ddp\)$", log, re.M), log
    if jobs.job.watch_steps:
        # mpirun starts one daemon per node with a plain srun: that step must own the CPUs of
        # all the node's ranks (2 x 1 on each of the 2 nodes), not one task's share.
        daemons = [line for line in jobs.steps.values() if "Name=orted" in line]
        assert daemons and all("TRES=cpu=4," in line for line in daemons), jobs.steps


@pytest.mark.parametrize("script", sorted(ARRAYS), ids=lambda s: s[:2])
def test_job_array_writes_one_record_per_task(jobs, script):
    tasks = [0, len(ARRAYS[script]) - 1]  # the tasks JOBS submits
    expected = [ARRAYS[script][i] for i in tasks]
    records = jobs.wait_completed()
    assert sorted(int(r["ArrayTaskId"]) for r in records) == tasks
    runs = jobs.runs()
    assert len(runs) == len(expected), [r.name for r in runs]
    for run in runs:
        _finished(run, 1)
    got = sorted((r.config["per_worker_batch"], r.config["lr_scaling"], r.config["warmup"]) for r in runs)
    assert got == expected
    assert {r.environment["workers"] for r in runs} == {1}  # the profile's one task per node
    assert {r.config["dist"] for r in runs} == {jobs.job.env.get("DIST", "horovod")}


@pytest.mark.parametrize("dist", [dist for _, dist, _, _ in TENSORFLOW])
def test_tensorflow(jobs, dist):
    # SlurmClusterResolver gives the tasks of every node the same ports (port base + local
    # index), which is right on real nodes; the tests' two "nodes" are one host, so the
    # native strategy runs on one of them (two workers, with a broken Horovod) and Horovod
    # on both (four).
    workers = {d: w for _, d, _, w in TENSORFLOW}[dist]
    jobs.wait_completed()
    (run,) = jobs.runs()
    _finished(run)
    assert (run.config["framework"], run.config["dist"], run.environment["workers"]) == ("tensorflow", dist, workers)
    if dist == "horovod":
        assert sorted(run.environment["slurm"]["nodes"]) == list(NODES)
        assert len(run.summary["weights_digests"]) == 4


# -- Jobs that must stop early, with one line that says why ------------------------------------

def test_a_horovod_job_without_horovod_stops_at_the_doctor(jobs):
    log = jobs.wait_failed_at_start()
    problems = [line for line in log.splitlines() if line.startswith("PROBLEM:")]
    assert len(problems) == 1 and "Horovod does not import" in problems[0], log[-3000:]
    assert "use --dist ddp, which needs no Horovod" in problems[0]
    assert "stack usable: NO (for --framework pytorch --dist horovod)" in log and "== staging" not in log


def test_a_tensorflow_job_given_gpus_it_cannot_use_stops_at_the_doctor(jobs):
    """08 (MultiWorkerMirroredStrategy) with two of the test Slurm's fake GPUs: its TensorFlow
    sees none, and the job ends before staging, with no run record, in one PROBLEM line that
    names the job's GPUs and what TensorFlow sees, instead of training on the CPU."""
    log = jobs.wait_failed_at_start()
    problems = [line for line in log.splitlines() if line.startswith("PROBLEM:")]
    assert len(problems) == 1, log[-3000:]
    assert re.match(r"PROBLEM: the job has GPUs \(CUDA_VISIBLE_DEVICES=\d,\d\) but this TensorFlow "
                    r"2\.15\.1 \(CPU-only build\) sees none, so it would train on the CPU", problems[0]), problems
    assert "stack usable: NO (for --framework tensorflow --dist mwms)" in log and "== staging" not in log


def test_an_incomplete_site_profile_stops_before_anything_runs(jobs, tmp_path):
    """Through submit.sh: refused on the login node, nothing submitted. With plain sbatch
    (the job of JOBS, submitted with this profile): the job stops at its first line."""
    broken = tmp_path / "broken.sh"
    broken.write_text("".join(line for line in (EXAMPLES / "sites/ci.sh").read_text().splitlines(keepends=True)
                              if not line.startswith("GUIDE_SCRATCH=")))
    out = subprocess.run([str(EXAMPLES / "submit.sh"), str(EXAMPLES / "01_single_gpu_baseline.sbatch")],
                         env={**jobs.env, "GUIDE_SITE": str(broken)}, capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"error: site profile {broken} does not set GUIDE_SCRATCH; add it "
                                               "(see slurm_examples/sites/TEMPLATE.sh)"]
    log = jobs.wait_failed_at_start()
    assert re.search(r"^error: site profile \S+/incomplete-site\.sh does not set GUIDE_SCRATCH", log, re.M), log
    assert "staging" not in log


def test_a_job_without_guide_site_stops_at_its_first_line(jobs):
    """sbatch'ed directly with no GUIDE_SITE: no silent default, one line naming it."""
    log = jobs.wait_failed_at_start()
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: GUIDE_SITE is not set; export GUIDE_SITE=NAME"), log
    assert "ci, gpus-per-node-apptainer, lumi-like, perlmutter-like, puhti-like, thesis-taito" in errors[0]
    assert "== site" not in log


@pytest.mark.parametrize("dist", ["horovod", "ddp"])
def test_dist_started_in_the_batch_script_fails_at_once(jobs, dist):
    """`python -m guide_utils.train --dist horovod|ddp` with no launcher, in the batch script
    itself (SLURM_PROCID=0 is set there too): one line and exit 2 within seconds, never a
    rank waiting for the others until the time limit."""
    log = jobs.wait_failed_at_start(timeout=180)
    (record,) = jobs.cluster.jobs(jobs.ids[0])
    h, m, s = map(int, record["RunTime"].split(":")[-3:])
    assert h * 3600 + m * 60 + s < 90, record["RunTime"]
    errors = [line for line in log.splitlines() if "error" in line]
    assert len(errors) == 1, log
    assert errors[0].startswith(f"python -m guide_utils.train: error: --dist {dist} was started directly in the "
                                f"batch script of job {jobs.ids[0]}"), errors


def test_a_full_scratch_disk_fails_the_job_at_staging(jobs, archive):
    """A real full disk (a 512 KiB tmpfs as node-local scratch, the archive is 3.6 MB): the
    job says how much room staging needs, then stops before unpacking with one line naming
    the node, the free space, the archive and the fix, not later in the training with a
    missing train/ folder."""
    log = jobs.wait_failed_at_start()
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, log
    scratch = re.escape(str(jobs.scratch))
    assert re.search(rf"^== staging {re.escape(str(archive))} \((\S+)\) to {scratch}/guide-{jobs.ids[0]}/digits on "
                     rf"each node: each needs at least \1 free in {scratch}$", log, re.M), log[-3000:]
    assert re.fullmatch(rf"error: staging on node guide-n[12]: {scratch} has \d+KiB free, and unpacking "
                        rf"{re.escape(str(archive))} takes at least its size, \S+; free space in {scratch} or set "
                        r"GUIDE_SCRATCH in \S+/ci\.sh to a larger node-local disk", errors[0]), errors[0]
    assert "guide_utils.train" not in log  # the training never started


# Listeners whose address the software hard-codes to "any" (see slurm_sockets.listener_kind):
# reported, not fixable by configuration. Everything else must be on loopback.
HARD_CODED_ANY = {"openmpi", "horovodrun", "torch-store", "tensorflow"}


def test_jobs_listen_on_loopback_where_it_can_be_configured(batch, cluster):
    """What the jobs of this module listened on, sampled every second while they ran. Slurm's
    step daemons and srun (CommunicationParameters=NoInAddrAny), Gloo and every other
    configurable listener are on loopback; the only others are the known hard-coded ones."""
    assert batch.subs, "run this test with the example tests: it checks their jobs"
    for sub in batch.subs.values():
        if not sub.job.until_cancelled:  # (waiting for that one would time out and cancel it)
            with contextlib.suppress(TimeoutError):
                sub.wait(600)
    seen = {s for s in cluster.seen_listeners if s[0] not in ("slurmctld", "slurmd")}
    assert "srun" in {c for c, kind, _, _ in seen if kind == "slurm"}, seen
    assert any(kind == "other" for _, kind, _, _ in seen), seen  # e.g. the workers' Gloo pairs
    exposed = sorted(s for s in seen if s[2] not in LOOPBACK)
    unexpected = [s for s in exposed if s[1] not in HARD_CODED_ANY]
    assert not unexpected, [(s, cluster.listener_pids.get(s)) for s in unexpected]
    print("hard-coded wildcard listeners:", sorted({(c, kind) for c, kind, _, _ in exposed}))


# -- CPUs and GPUs as the training processes see them ------------------------------------------

def _checks(log: str) -> dict[str, tuple[int, str]]:
    """The probe jobs' checks: name -> (exit status, what the check printed)."""
    found = re.findall(r"^== check: ([^\n]+)\n(.*?)^== status (\d+)$", log, re.M | re.S)
    return {name: (int(status), text) for name, text, status in found}


def _problems(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("PROBLEM")]


def test_probes_cpus(jobs):
    """task/affinity binds for real: without SRUN_CPUS_PER_TASK each task of a two-CPU job
    gets one CPU under --cpu-bind=cores, and the per-task check says so; with it, two."""
    jobs.wait_completed()
    checks = _checks(jobs.log())
    status, text = checks["cpus without SRUN_CPUS_PER_TASK"]
    assert status == 1 and len(_problems(text)) == 2 and all("SRUN_CPUS_PER_TASK" in p for p in _problems(text)), text
    status, text = checks["cpus with SRUN_CPUS_PER_TASK"]
    assert status == 0 and not _problems(text), text


def test_probes_gpus(jobs):
    """The fake GPUs are really allocated: per-step and per-task lists give each rank its
    own GPU (the one the engine's rule picks); two ranks on one GPU is a PROBLEM; and the
    doctor in a GPU step says that this PyTorch sees none of the job's GPUs."""
    jobs.wait_completed()
    checks = _checks(jobs.log())
    for name in ("per-node gpus", "per-task gpus"):
        status, text = checks[name]
        assert status == 0 and not _problems(text), (name, text)
    status, text = checks["one gpu for two ranks"]
    assert status == 1 and any("GPU" in p for p in _problems(text)), text
    status, text = checks["doctor in a gpu step"]
    assert status == 1 and any("CUDA_VISIBLE_DEVICES=0" in p for p in _problems(text)), text


def test_probes_sites(jobs):
    """Every shipped site profile's GPU request and srun options (per node with --gres or
    --gpus-per-node, per task with and without --gpu-bind, CPU masks) on the fake GPUs: each
    step's ranks get a GPU each, their own, and the check passes."""
    jobs.wait_completed()
    checks = _checks(jobs.log())
    assert sorted(checks) == SITES, jobs.log(3000)
    for site, (status, text) in checks.items():
        (report,) = re.findall(r"GPU by rank: (.+)$", text, re.M)
        gpus = [pair.split(":")[1] for pair in report.split()]
        assert status == 0 and not _problems(text) and sorted(gpus) == ["0", "1"], (site, text)


def test_each_task_gets_the_cpus_the_job_asked_for(jobs):
    """A site that binds tasks to cores (GUIDE_SRUN_ARGS=(--cpu-bind=cores)) and asks two
    CPUs per task: guide.sh exports SRUN_CPUS_PER_TASK, so the training task has both."""
    jobs.wait_completed()
    (run,) = jobs.runs()
    _finished(run, 1)
    log = jobs.log()
    assert "site srun options: --cpu-bind=cores" in log, log[-3000:]
    assert re.search(r"^guide-n[12] +1 task\(s\), 2 CPU\(s\) each \(asked 2\)", log, re.M), log[-3000:]


@pytest.mark.parametrize("like", ["puhti-like"])
def test_a_site_profile_runs_on_fake_gpus(jobs, like):
    """The site's GPU request (per node with --gres; per task with --gpus-per-task in
    test_your_own_script) and its srun options, on the test Slurm's fake GPUs: the job's
    per-task check passes (each rank its own GPU) and the training runs (on the CPUs: no GPU
    is real)."""
    jobs.wait_completed()
    (run,) = jobs.runs()
    _finished(run)
    assert run.environment["workers"] == 4
    # The job's per-task report: on each node, each rank on its own (fake) GPU.
    reports = re.findall(r"^guide-n[12] +2 task\(s\).*; GPU by rank: (.+)$", jobs.log(), re.M)
    assert len(reports) == 2, jobs.log(3000)
    for report in reports:
        gpus = [pair.split(":")[1] for pair in report.split()]
        assert len(set(gpus)) == 2 and "-" not in gpus and "?" not in gpus, report


# -- Staging that is the job's own, chains that do not wait forever (issue 23) -----------------

def _gone(path: Path, timeout: float = 60) -> bool:
    """Whether ``path`` disappears within ``timeout`` seconds (clean-up runs as the job ends)."""
    end = time.monotonic() + timeout
    while path.exists() and time.monotonic() < end:
        time.sleep(0.5)
    return not path.exists()


def test_a_failed_link_cancels_the_rest_of_the_chain(jobs):
    """The first link fails after staging (a mistyped model): Slurm cancels the second
    (chain.sh's --kill-on-invalid-dep=yes) instead of leaving it pending forever with reason
    DependencyNeverSatisfied, and the failed job's copy of the dataset is gone with it."""
    first, second = jobs.ids
    (failed,) = jobs.cluster.wait(first, 300)
    assert (failed["JobState"], failed["ExitCode"]) == ("FAILED", "2:0"), f"{failed}\n{jobs.log(3000)}"
    try:
        (rest,) = jobs.cluster.wait(second, 60)
    except TimeoutError as exc:
        pytest.fail(f"the second link still waits after the first failed: {exc}")
    assert rest["JobState"] == "CANCELLED", rest
    log = jobs.log()
    assert f"to {jobs.scratch}/guide-{first}/digits on each node" in log and "no_such_model" in log, log[-3000:]
    assert _gone(jobs.scratch / f"guide-{first}"), sorted(p.name for p in jobs.scratch.iterdir())


def test_staging_is_the_jobs_own_and_goes_when_it_is_cancelled(jobs):
    """A folder where a shared scratch would hold the dataset (another job's, or half of
    one) is not taken for this job's copy: each node stages into guide-<job id>, readable by
    the user alone. scancel then ends the job, and the copy with it: renamed at once, then
    removed (or, when srun's SIGKILL cuts that short, removed by the next staging: see
    tests/test_staging.py)."""
    (job_id,) = jobs.ids
    folder = jobs.scratch / f"guide-{job_id}"
    end = time.monotonic() + 300
    while "waiting to be cancelled" not in jobs.log() and time.monotonic() < end:
        assert jobs.cluster.finished(job_id) is None, jobs.log(3000)
        time.sleep(0.5)
    log = jobs.log()
    assert f"== staged to {folder}/digits; waiting to be cancelled" in log, log[-3000:]
    assert jobs.cluster.finished(job_id) is None, log[-3000:]  # still running: its copy must be there
    assert sorted(p.name for p in (folder / "digits").iterdir()) == ["train", "val"]
    assert len(list((folder / "digits" / "train").iterdir())) == 10 and folder.stat().st_mode & 0o777 == 0o700
    subprocess.run(["scancel", job_id], env=jobs.cluster.env, check=True)
    (record,) = jobs.wait(120)
    assert record["JobState"] == "CANCELLED", record
    assert _gone(folder), sorted(p.name for p in folder.rglob("*"))[:20]
    left = {p.name for p in jobs.scratch.iterdir()}
    assert left <= {"digits", f".guide-{job_id}.removing"}, left
    assert (jobs.scratch / "digits" / "train" / "0").is_dir()  # the other folder is left alone
    # Slurm's TERM, then the exiting batch shell's USR2: each node's holder removes it once
    # (or is killed first: srun's answer to its own TERM).
    removals = re.findall(r"^== node (\S+): removing the job's staged copy", jobs.log(), re.M)
    assert all(removals.count(node) == 1 for node in removals), removals


# -- The reader's own script (chapter 16) ------------------------------------------------------
# 16_your_own_script.sbatch runs a command of the reader's instead of the guide's engine: the
# Horovod example started by srun's MPI plugin; and, warned once their first epoch is logged,
# the DDP example started by srun alone (ranks and rendezvous from SLURM_*) through LUMI's GPU
# selector, a wrapper that execs it (select_gpu); by one torchrun per node through that
# selector and a bash wrapper that runs it as its child (train.sh); and the Horovod example by
# horovodrun on one node through the bash wrapper. The warned ones ask for their GPUs as
# perlmutter-like.sh does (per task, the binding inherited from the job's environment), so one
# torchrun per node must see both of its node's GPUs. All keep their checkpoint in the job's
# folder ({checkpoints}) and print every rank's weights digest.
YOUR_SCRIPT = ("--steps-per-epoch", "8", "--warmup-epochs", "1", "--milestones", "30", "--log-every", "4",
               "--checkpoint", "{checkpoints}/ckpt.pt")
SELECT_GPU, TRAIN_SH = "tests/data/select_gpu", "tests/data/train.sh"
# Long enough to be warned on a loaded machine (a step takes milliseconds): warned after "epoch
# 1/", one stopped at step 30 (epoch 4) in a run with two more jobs beside the suite's, so 60
# epochs leave a margin of about 15; it stops at the warning, and its resumed start ends the
# remaining epochs in seconds (past the milestone at 30).
WARNED_SCRIPT = ("--epochs", "60", *YOUR_SCRIPT)
JOBS["test_your_own_script[horovod]"] = Job(
    "16_your_own_script.sbatch", env={"LAUNCHER": "srun", "DIST": "horovod"},
    train=("python", "examples/your_script/train_horovod.py", "--epochs", "2", *YOUR_SCRIPT))
JOBS["test_your_own_script[srun]"] = Job(
    "16_your_own_script.sbatch", env={"LAUNCHER": "srun", "DIST": "ddp"}, broken_horovod=True, like="perlmutter-like",
    train=(SELECT_GPU, "python", "examples/your_script/train_ddp.py", *WARNED_SCRIPT),
    usr1_after_epoch=True, first_epoch=r"^epoch 1/")
JOBS["test_your_own_script[torchrun]"] = Job(
    "16_your_own_script.sbatch", env={"LAUNCHER": "torchrun"}, broken_horovod=True, like="perlmutter-like",
    train=(SELECT_GPU, "bash", TRAIN_SH, "python", "examples/your_script/train_ddp.py", *WARNED_SCRIPT),
    usr1_after_epoch=True, first_epoch=r"^epoch 1/")
JOBS["test_your_own_script[horovodrun]"] = Job(
    "16_your_own_script.sbatch", sbatch=("--nodes=1",), env={"LAUNCHER": "horovodrun"}, like="perlmutter-like",
    train=("bash", TRAIN_SH, "python", "examples/your_script/train_horovod.py", *WARNED_SCRIPT),
    usr1_after_epoch=True, first_epoch=r"^\[0\]<stdout>:epoch 1/")  # horovodrun's prefix


@pytest.mark.parametrize("launcher", ["horovod", "srun", "torchrun", "horovodrun"])
def test_your_own_script(jobs, launcher):
    """The reader's command ran on every rank (four on two nodes, two for horovodrun's one; the
    same weights at the end, the schedule of the linear rule and gradual warmup); a warned job
    passed the warning through its wrappers to the training processes alone (neither a wrapper
    nor a launcher died of it), which checkpointed, and the job requeued itself and resumed from
    that checkpoint to the last epoch. Where the GPUs are asked per task, each node's ranks got
    a GPU each, their own, from one torchrun per node too."""
    from guide_utils.results import your_script

    records = jobs.wait_completed()
    log = jobs.log()
    workers = 2 if launcher == "horovodrun" else 4
    epochs = int(jobs.job.train[jobs.job.train.index("--epochs") + 1])
    assert f"epoch {epochs}/{epochs}" in log, log[-3000:]
    digests = your_script.printed_digests(log)
    assert sorted(digests) == list(range(workers)) and len(set(digests.values())) == 1, log[-3000:]
    lrs = your_script.printed_lrs(log)
    assert lrs and all(lr == pytest.approx(your_script.expected_lr(step, lr=0.05, workers=workers, steps_per_epoch=8,
                                                                    warmup_epochs=1, milestones=(30,)), rel=1e-8)
                       for step, lr in lrs.items()), lrs
    assert "== note: the command does not mention {checkpoints}" not in log and "[train]" not in log
    if jobs.job.usr1_after_epoch:
        _warned(jobs)
        assert all(int(r["Restarts"]) >= 1 for r in records), f"the job was never requeued\n{log[-3000:]}"
        assert "== USR1: time limit near" in log and "requeueing job" in log and "== restart 1 (requeued)" in log, \
            log[-3000:]
        assert re.search(r"^(\[\d+\]<stdout>:)?resuming from \S+/ckpt\.pt at step [1-9]\d*$", log, re.M), log[-3000:]
        ended = re.findall(r"^== launch ended with status (\d+) after the warning$", log, re.M)
        assert ended and "138" not in ended, log[-3000:]  # 128 + USR1: a wrapper or launcher died of it
    if jobs.job.like:
        reports = re.findall(r"^guide-n[12] +2 task\(s\).*; GPU by rank: (.+)$", log, re.M)
        assert reports and len(reports) % (workers // 2) == 0, log[-3000:]  # each node's, at each start
        for report in reports:
            gpus = [pair.split(":")[1] for pair in report.split()]
            assert len(set(gpus)) == 2 and "-" not in gpus and "?" not in gpus, report
