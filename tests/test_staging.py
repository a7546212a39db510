"""The dataset staging of lib/guide.sh (guide_stage_data and lib/stage_node.sh), on this
machine with a stand-in ``srun`` that runs each step's command here, as one node: the
copy is the job's own folder, refused on a network file system or a disk too small,
never another user's folder, and removed when the batch shell ends (normally or by TERM).
tests/test_slurm_examples.py runs the same staging in jobs of the test Slurm."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "slurm_examples"
JOB = "4242"
PROFILE = """\
GUIDE_ACCOUNT="" GUIDE_PARTITION="" GUIDE_TASKS_PER_NODE=1 GUIDE_CPUS_PER_TASK=1 GUIDE_GPU_REQUEST=""
GUIDE_SCRATCH="{scratch}" GUIDE_SOFTWARE=venv GUIDE_VENV=/nowhere GUIDE_TRAIN_PROFILE=smoke GUIDE_SRUN_MPI=pmix
GUIDE_DATASET_ARCHIVE="{archive}" GUIDE_DATASET_NAME=toy
GUIDE_TRAIN_ARGS=() GUIDE_SBATCH_EXTRA=()
"""


def _fake(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
    (bin_dir / name).chmod(0o755)


@pytest.fixture
def node(tmp_path):
    """A one-node "job": a toy archive, a scratch disk, srun that runs the step here, and df
    answering FAKE_FSTYPE / FAKE_AVAIL when they are set (else the real df)."""
    archive = tmp_path / "toy.tar"
    with tarfile.open(archive, "w") as tar:
        for split in ("train", "val"):
            info = tarfile.TarInfo(f"toy/{split}/a/0.png")
            info.size = 3
            tar.addfile(info, io.BytesIO(b"png"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    bin_dir = tmp_path / "bin"
    # FAKE_HOLD_LATE: the holder step has not started (a busy node) when the batch shell is done:
    # the shell's USR2 ends the srun that was still waiting.
    # (the holder's mark, by which the time-limit warning's scan leaves it alone, goes to a file)
    _fake(bin_dir, "srun", 'while [[ $1 == -* ]]; do shift; done\n'
          '[[ $3 != hold ]] || echo "${GUIDE_SCRATCH_HOLDER:-unmarked}" >"$TMPDIR/holder-mark"\n'
          '[[ $3 != hold || -z ${FAKE_HOLD_LATE:-} ]] || while :; do sleep 0.05; done\nexec "$@"')
    real_df = subprocess.run(["bash", "-c", "command -v df"], capture_output=True, text=True).stdout.strip()
    _fake(bin_dir, "df", f"""\
case "$*" in
    *--output=fstype*) [[ -n ${{FAKE_FSTYPE:-}} ]] && {{ echo Type; echo "$FAKE_FSTYPE"; exit 0; }} ;;
    *--output=avail*) [[ -n ${{FAKE_AVAIL:-}} ]] && {{ echo Avail; echo "$FAKE_AVAIL"; exit 0; }} ;;
esac
exec {real_df} "$@\"""")
    site = tmp_path / "site.sh"
    site.write_text(PROFILE.format(scratch=scratch, archive=archive))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GUIDE_")) or k == "GUIDE_TEST_RUN"}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", GUIDE_ROOT=str(REPO), GUIDE_SITE=str(site), SLURM_JOB_ID=JOB,
               SLURM_JOB_NUM_NODES="1", SLURMD_NODENAME="node1", TMPDIR=str(tmp_path))

    def run(script: str = "", background: bool = False, **extra: str):
        code = f'source "{EXAMPLES}/lib/guide.sh"\nset -euo pipefail\nguide_load_site\nguide_stage_data\n{script}'
        args = dict(env={**env, **extra}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        if background:  # its own process group: the test ends what the script left running
            return subprocess.Popen(["bash", "-c", code], start_new_session=True, **args)
        return subprocess.run(["bash", "-c", code], **args)

    run.scratch, run.site, run.archive = scratch, site, archive
    return run


# A folder of another user can only be made by root (the CI runs as root, as the test Slurm needs).
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder of another user")


def _one_error(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: staging on node node1: "), line
    return line.removeprefix("error: staging on node node1: ")


def test_the_copy_is_this_jobs_own_folder_and_goes_with_the_job(node, tmp_path):
    """A folder someone left where a shared scratch would hold the dataset is not taken
    for this job's copy; the copy is guide-<job id>/NAME, data only this user reads, and it
    is gone once the batch shell has exited. The holder's step carries the job's mark, by which
    lib/signal_node.sh never sends it the time-limit warning (it would die of it)."""
    (node.scratch / "toy" / "train").mkdir(parents=True)  # another job's, or half of one
    out = node('ls "${GUIDE_DATA_ARGS[1]}"; stat -c %a "$(dirname "${GUIDE_DATA_ARGS[1]}")"')
    assert out.returncode == 0, out.stderr
    folder = node.scratch / f"guide-{JOB}"
    size = subprocess.run(["numfmt", "--to=iec-i", "--suffix=B", str(node.archive.stat().st_size)],
                          capture_output=True, text=True).stdout.strip()
    assert out.stdout.splitlines() == [
        f"== staging {node.archive} ({size}) to {folder}/toy on each node: each needs at least {size} free in "
        f"{node.scratch}", "train", "val", "700",
        f"== node node1: removing the job's staged copy {folder} (the batch script is done with it)"]
    assert sorted(p.name for p in node.scratch.iterdir()) == ["toy"]  # ours removed, the other left alone
    assert (tmp_path / "holder-mark").read_text() == f"{JOB}\n"


def test_an_empty_scratch_means_tmpdir(node, tmp_path):
    node.site.write_text(node.site.read_text().replace(f'GUIDE_SCRATCH="{node.scratch}"', 'GUIDE_SCRATCH=""'))
    out = node('echo "${GUIDE_DATA_ARGS[1]}"')
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-2] == f"{tmp_path}/guide-{JOB}/toy"
    assert not (tmp_path / f"guide-{JOB}").exists()


@pytest.mark.parametrize("fstype", ["nfs4", "lustre", "gpfs", "beegfs", "cifs"])
def test_a_network_file_system_is_refused(node, fstype):
    message = _one_error(node(FAKE_FSTYPE=fstype))
    assert message == (f"GUIDE_SCRATCH={node.scratch} is on {fstype}, a network file system, not this node's own "
                       f"disk; set GUIDE_SCRATCH in {node.site} to the node-local disk your centre's user guide names "
                       "($TMPDIR, $LOCAL_SCRATCH), or to empty for $TMPDIR")
    assert list(node.scratch.iterdir()) == []


def test_the_space_is_checked_before_unpacking(node):
    message = _one_error(node(FAKE_AVAIL="1000"))
    assert message.startswith(f"{node.scratch} has 1000B free, and unpacking {node.archive} takes at least its size")
    assert message.endswith(f"free space in {node.scratch} or set GUIDE_SCRATCH in {node.site} to a larger "
                            "node-local disk")
    assert list(node.scratch.iterdir()) == []  # the job's empty folder went with it


@as_root
def test_another_users_folder_of_the_same_name_is_refused_and_left_alone(node):
    theirs = node.scratch / f"guide-{JOB}"
    (theirs / "toy").mkdir(parents=True)
    os.chown(theirs, 65534, 65534)
    message = _one_error(node())
    assert message.startswith(f"{theirs} exists and belongs to ") and message.endswith(", not to you; remove it, "
                                                                                     f"or set GUIDE_SCRATCH in "
                                                                                     f"{node.site} to a disk folder "
                                                                                     "of yours")
    assert (theirs / "toy").is_dir()


def test_a_complete_copy_of_this_job_is_used_again(node):
    """A requeued job on the same node whose earlier start was killed before its clean-up."""
    (node.scratch / f"guide-{JOB}" / "toy" / "train").mkdir(parents=True)
    out = node()
    assert out.returncode == 0, out.stderr
    assert f"{node.scratch}/guide-{JOB}/toy is complete already (this job's own copy)" in out.stdout
    assert list(node.scratch.iterdir()) == []


@as_root
def test_what_a_cut_short_clean_up_left_is_removed_by_the_next_staging(node):
    """A cancel can SIGKILL the clean-up half-way (srun's answer to its own TERM): the copy
    it had renamed to .guide-<job id>.removing goes at this user's next staging there."""
    mine, theirs = node.scratch / ".guide-1111.removing", node.scratch / ".guide-2222.removing"
    (mine / "toy").mkdir(parents=True)
    (theirs / "toy").mkdir(parents=True)
    os.chown(theirs, 65534, 65534)
    out = node()
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in node.scratch.iterdir()) == [theirs.name]


def test_a_batch_shell_ended_by_term_removes_the_copy(node):
    """scancel, the time limit or a requeue send TERM to the batch shell (and to the steps)."""
    proc = node('echo staged; sleep 60 >/dev/null & wait', background=True)
    assert proc.stdout.readline().startswith("== staging")
    assert proc.stdout.readline() == "staged\n"
    assert (node.scratch / f"guide-{JOB}" / "toy" / "val").is_dir()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the step's sleep, which Slurm would end with the job
    end = time.monotonic() + 10
    while list(node.scratch.iterdir()) and time.monotonic() < end:
        time.sleep(0.1)
    assert list(node.scratch.iterdir()) == []
    assert proc.stdout.read().splitlines() == [f"== node node1: removing the job's staged copy {node.scratch}/guide-"
                                               f"{JOB} (the batch script is done with it)"]


def test_a_holder_that_starts_after_the_batch_shell_is_done_still_gets_the_copy_removed(node):
    """A job that ends at once (here: right after staging) may send its USR2 before the
    holder listens; the holder then dies of it, and a step of its own removes the copy."""
    out = node("true", FAKE_HOLD_LATE="1")
    assert out.returncode == 0, out.stderr
    assert list(node.scratch.iterdir()) == []
    assert out.stdout.splitlines()[-1] == (f"== node node1: removing the job's staged copy {node.scratch}/guide-{JOB} "
                                           "(the batch script is done with it; its holder had not started)")



def _cgroups(root: Path, limit: str) -> Path:
    """A cgroup file system at ``root`` holding this process's own cgroups, as /proc/self/cgroup
    names them (the staging runs in the same), with the memory limit ``limit`` one level above
    the process's (where Slurm sets the job's, above the step's and the task's) and none
    elsewhere: v2's memory.max, v1's memory.limit_in_bytes."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0":
            base, name, unlimited = root, "memory.max", "max"
        elif "memory" in controllers.split(","):
            base, name, unlimited = root / "memory", "memory.limit_in_bytes", "9223372036854771712"
        else:
            continue
        own = base / path.strip("/")
        own.mkdir(parents=True, exist_ok=True)
        levels = [own, *[f for f in own.parents if f.is_relative_to(base)]]
        limited = levels[1] if len(levels) > 1 else own
        for folder in levels:
            (folder / name).write_text(f"{limit if folder == limited else unlimited}\n")
    return root


def test_a_scratch_in_memory_is_checked_against_the_jobs_memory_limit(node, tmp_path):
    """/tmp in memory (tmpfs, as on Cray nodes) holds the copy in the job's memory: a copy larger
    than the job's limit is refused in one line before tar is killed for memory (which would
    read as a full disk); under the limit, or with no limit to read, it is staged."""
    message = _one_error(node(FAKE_FSTYPE="tmpfs", GUIDE_CGROUP_ROOT=str(_cgroups(tmp_path / "cgroup", "1000"))))
    assert message.startswith(f"{node.scratch} is in memory (tmpfs) and counts against this job's memory limit, "
                              f"1000B, which the copy of {node.archive} ("), message
    assert message.endswith(f"or set GUIDE_SCRATCH in {node.site} to a node-local disk")
    assert list(node.scratch.iterdir()) == []
    for root in (_cgroups(tmp_path / "roomy", str(10 ** 12)), tmp_path / "none"):
        out = node('ls "${GUIDE_DATA_ARGS[1]}"', FAKE_FSTYPE="tmpfs", GUIDE_CGROUP_ROOT=str(root))
        assert out.returncode == 0 and out.stdout.splitlines()[1:3] == ["train", "val"], out.stderr
