"""The sbatch examples as files: shellcheck-clean, built on the shared library, and moved
between sites by the site profile alone (what submit.sh would submit, without a Slurm)."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "slurm_examples"
SCRIPTS = sorted(EXAMPLES.glob("[0-9][0-9]_*.sbatch"))
SHELL_FILES = [*SCRIPTS, *EXAMPLES.glob("*.sh"), *EXAMPLES.glob("lib/*.sh"), *EXAMPLES.glob("sites/*.sh")]


def test_the_examples_mirror_the_notebooks():
    assert [p.stem for p in SCRIPTS] == ["01_single_gpu_baseline", "02_single_node_data_parallel",
                                         "03_multi_node_horovod", "04_naive_scaling", "05_linear_scaling_rule",
                                         "06_learning_rate_warmup", "07_per_worker_batch_size", "08_tensorflow_horovod",
                                         "08_tensorflow_native", "09_notebook_batch", "10_communication",
                                         "12_stepwise_tuning", "16_your_own_script"]


def test_shellcheck_is_clean():
    if not shutil.which("shellcheck"):
        pytest.fail("shellcheck is missing: scripts/setup.sh installs it (apt-get install shellcheck)")
    out = subprocess.run(["shellcheck", "-x", "-P", "SCRIPTDIR", *map(str, SHELL_FILES)], capture_output=True,
                         text=True, cwd=REPO)
    assert out.returncode == 0, out.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_script_follows_the_conventions(script):
    text = script.read_text()
    body = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert body[0] == "set -euo pipefail", "first command must be set -euo pipefail"
    setup = [line for line in body if line.startswith("guide_setup")]
    dist = r'(none|ddp|horovod|mwms|"\$\w+"|"\$\(guide_dist \w+\)")'
    usage = rf'guide_setup (pytorch|tensorflow|"\$\w+") {dist}( tasks| node| shell| "\$launch")?'
    assert len(setup) == 1 and re.fullmatch(usage, setup[0].split("  #")[0]), \
        "must call guide_setup FRAMEWORK DIST [LAUNCH] once (site profile, the doctor for this job, staging)"
    assert f"#SBATCH --job-name={script.stem}" in text
    # Every launch: srun with the job's task options (--kill-on-bad-exit=1, the site's srun
    # options, the MPI plugin, the software prefix), or a launcher that ends all on a failure.
    body = [re.sub(r"\s+#\s.*$", "", line) for line in body]  # code only, not its comments
    code = "\n".join(body)
    launches = re.findall(r"(?:^|[\s;|&])(srun|horovodrun|torchrun|mpirun|papermill)( .*)", code, re.M)
    assert launches, "every script launches with srun (or a launcher that ends all on a failure)"
    for launcher, rest in launches:
        if launcher == "srun":
            assert re.match(r' "\$\{GUIDE_SRUN_(TASKS|NODES)\[@\]\}"', rest), f"srun{rest}: use GUIDE_SRUN_TASKS/NODES"
    # Training survives its time limit: checkpoints (GUIDE_TRAIN_FLAGS), requeue on Slurm's warning.
    if "guide_utils.train" in code:
        commands = re.sub(r"\\\n\s*", " ", code).splitlines()  # continuation lines joined
        bare = [line for line in commands if re.match(r'\s*(srun|horovodrun|torchrun|mpirun|\$\{GUIDE_EXEC\S*) ', line)]
        assert not bare, f"{script.name}: launch training through guide_run_requeueable: {bare}"
        for option in ("--signal=B:USR1@600", "--requeue", "--open-mode=append"):
            assert f"#SBATCH {option}" in text, f"{script.name} lacks #SBATCH {option}"
    assert not re.search(r"--(account|partition|gres|gpus-per-node)=", text), "site values belong in the profile"


def _submit(site: str | None, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GUIDE_SITE"}
    if site is not None:
        env["GUIDE_SITE"] = site
    return subprocess.run([str(EXAMPLES / "submit.sh"), *args], env=env, capture_output=True, text=True, cwd=REPO)


def _dry_run(site: str, script: str, *extra: str) -> str:
    out = _submit(site, "--dry-run", str(EXAMPLES / script), *extra)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_only_the_site_profile_changes_between_centres():
    script = "03_multi_node_horovod.sbatch"
    ci = _dry_run("ci", script)
    taito = _dry_run("thesis-taito", script, "--nodes=8")
    modern = _dry_run("gpus-per-node-apptainer", script)
    assert "--ntasks-per-node=2 --cpus-per-task=1 " in ci and "gpu" not in ci.split(script)[0]
    assert "--ntasks-per-node=4 --account=project_0000000 --partition=gpu --cpus-per-task=7 --gres=gpu:p100:4" in taito
    assert "--nodes=8" in taito
    assert "--ntasks-per-node=8 --account=my_project --partition=gpu --cpus-per-task=8 --gpus-per-node=8" in modern
    # The single-GPU baseline pins one task per node: one GPU in the site's syntax.
    assert "--gres=gpu:p100:1" in _dry_run("thesis-taito", "01_single_gpu_baseline.sbatch")
    for out in (ci, taito, modern):
        assert str(EXAMPLES / script) in out  # the same script file everywhere


@pytest.mark.parametrize("site, message", [
    ("nowhere", "site profile '{examples}/sites/nowhere.sh' not found; set GUIDE_SITE to one of"),
])
def test_an_unknown_site_is_one_clear_line(site, message):
    env = {**os.environ, "GUIDE_SITE": site}
    out = subprocess.run([str(EXAMPLES / "submit.sh"), str(EXAMPLES / "01_single_gpu_baseline.sbatch")],
                         env=env, capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert message.format(examples=EXAMPLES) in out.stderr


def test_chain_refuses_what_it_sets_itself():
    out = subprocess.run([str(EXAMPLES / "chain.sh"), "3", "10", str(EXAMPLES / "01_single_gpu_baseline.sbatch"),
                          "--", "--epochs", "90"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2 and "do not pass --epochs" in out.stderr


def test_a_command_the_warning_cannot_reach_is_refused_or_warned_about_before_it_queues(tmp_path):
    """16 with your own command, through submit.sh: a launcher inside the command (the warning
    would reach it, not the training) is refused in one line and nothing is submitted; a script
    that execs a program its command line does not name gets one line of warning and is submitted;
    a wrapper that execs the program the command names (LUMI's select_gpu) gets neither."""
    script = "16_your_own_script.sbatch"
    out = _submit("ci", "--dry-run", str(EXAMPLES / script), "--", "torchrun", "--standalone", "train.py")
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: the command starts torchrun itself: give the training command alone"), line
    (tmp_path / "train.sh").write_text('#!/bin/bash\nmodule load x\nexec python train.py "$@"\n')
    out = _submit("ci", "--dry-run", str(EXAMPLES / script), "--", "bash", str(tmp_path / "train.sh"), "--epochs", "3")
    assert out.returncode == 0 and out.stdout.startswith("sbatch "), out.stderr
    (line,) = out.stderr.strip().splitlines()
    wrapper = tmp_path / "train.sh"
    assert line.startswith(f"warning: {wrapper} execs another program (line 3: exec python train.py"), line
    select = tmp_path / "select_gpu"
    select.write_text('#!/bin/bash\nexport ROCR_VISIBLE_DEVICES=$SLURM_LOCALID\nexec "$@"\n')
    select.chmod(0o755)
    out = _submit("ci", "--dry-run", str(EXAMPLES / script), "--", str(select), "python", "train.py")
    assert out.returncode == 0 and out.stderr == "", out.stderr


@pytest.mark.parametrize("command, launcher", [
    (["accelerate", "launch", "--num_processes", "4", "train.py"], "accelerate"),
    (["deepspeed", "--num_gpus", "4", "train.py"], "deepspeed"),
    (["uv", "run", "python", "train.py"], "uv run"),
])
def test_a_launcher_by_another_name_in_the_command_is_refused_before_it_queues(command, launcher):
    """accelerate launch and deepspeed start their own processes (the warning would reach them,
    not the training), and uv run would sync the environment in every task: one line, nothing
    submitted. A flag's value that names one (--backend deepspeed) is the program's own."""
    script = str(EXAMPLES / "16_your_own_script.sbatch")
    out = _submit("ci", "--dry-run", script, "--", *command)
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"error: the command starts {launcher}"), line
    out = _submit("ci", "--dry-run", script, "--", "python", "train.py", "--backend", command[0])
    assert out.returncode == 0 and out.stderr == "", out.stderr


def _site(tmp_path: Path, request: str) -> str:
    """The CI profile with another GPU request, as a profile file of its own."""
    path = tmp_path / "site.sh"
    path.write_text((EXAMPLES / "sites/ci.sh").read_text() + f"GUIDE_GPU_REQUEST='{request}'\n")
    return str(path)


def test_a_gpu_request_of_several_options_reaches_sbatch_as_several(tmp_path):
    """"--gpus-per-node=%d --gres=nvme:200" (the form guide.sh's comment gives): two sbatch
    options, not one argument with a space in it, which sbatch would refuse."""
    out = _submit(_site(tmp_path, "--gpus-per-node=%d --gres=nvme:200"), "--dry-run",
                  str(EXAMPLES / "03_multi_node_horovod.sbatch"))
    assert out.returncode == 0, out.stderr
    words = shlex.split(out.stdout)
    assert "--gpus-per-node=2" in words and "--gres=nvme:200" in words, out.stdout


@pytest.mark.parametrize("request_", ["--gpus=%d", "-G %d", "--gres=nvme:1 --gpus=%d"])
def test_a_gpu_request_for_the_whole_job_is_refused_in_one_line(tmp_path, request_):
    """--gpus counts the job's GPUs in all, which Slurm may place unevenly on a job's nodes."""
    out = _submit(_site(tmp_path, request_), "--dry-run", str(EXAMPLES / "03_multi_node_horovod.sbatch"))
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert f"GUIDE_GPU_REQUEST='{request_}'" in line and "asks for the job's GPUs in all (--gpus)" in line, line
    assert "--gpus-per-node=%d" in line and "--gpus-per-task=1" in line, line


def test_the_site_must_be_named():
    """No default site: without GUIDE_SITE, submit.sh stops with one line naming it and the
    shipped profiles (a job sbatch'ed directly does the same at its first line, tested on
    the real Slurm in test_slurm_examples.py)."""
    out = _submit(None, "--dry-run", str(EXAMPLES / "01_single_gpu_baseline.sbatch"))
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: GUIDE_SITE is not set; export GUIDE_SITE=NAME")
    assert "ci, gpus-per-node-apptainer, lumi-like, perlmutter-like, puhti-like, thesis-taito" in line and "TEMPLATE.sh" in line


# -- --workers: the site's GPUs per node decide the layout, never a constant in Python ----------

def _sbatch_layout(command: str, site: str) -> tuple[int, int, int | None, list[str]]:
    """Submit a printed plan command with --dry-run: (nodes, tasks per node, GPUs requested
    per node, training flags), with the script's #SBATCH values where the command sets none."""
    argv = shlex.split(command)
    while re.fullmatch(r"[A-Z_]+=\S*", argv[0]):  # DIST=ddp, LAUNCHER=... prefixes
        argv.pop(0)
    assert argv[0] == "slurm_examples/submit.sh", command
    sbatch = shlex.split(_dry_run(site, argv[1].removeprefix("slurm_examples/"), *argv[2:]))
    at = next(i for i, a in enumerate(sbatch) if a.endswith(".sbatch"))
    opts, train = sbatch[1:at], sbatch[at + 1:]
    script = (REPO / argv[1]).read_text()

    def value(name: str) -> str | None:
        given = [o.split("=", 1)[1] for o in opts if o.startswith(f"--{name}=")]
        own = re.findall(rf"^#SBATCH --{name}=(\S+)", script, re.M)
        return (given or own or [None])[-1]

    gpus = [int(m) for o in opts for m in re.findall(r"^--(?:gres=gpu:\w+|gpus-per-node)[:=](\d+)$", o)]
    assert len(gpus) <= 1, opts
    return int(value("nodes")), int(value("ntasks-per-node")), (gpus or [None])[0], train


@pytest.mark.parametrize("site, gpus_per_node", [("thesis-taito", 4), ("gpus-per-node-apptainer", 8)])
def test_the_exp6_plan_runs_the_thesis_workers_batch_and_lr_at_every_site(site, gpus_per_node):
    """Every run of experiment 6, submitted as printed: nodes x tasks per node is the thesis's
    GPU count, one GPU per task, and per-worker batch x workers and the learning rate are the
    thesis's, on nodes of 4 GPUs and of 8 alike."""
    from guide_utils.results.sources import thesis_quality
    from guide_utils.core.scaling import scaled_lr
    from guide_utils.studies.experiments import plan

    thesis = thesis_quality(6)
    chosen = plan("exp6", "full")
    assert sorted(r.workers for _, r, _ in chosen) == sorted(set(thesis["gpus"]))
    for _, run, command in chosen:
        nodes, tasks, gpus, train = _sbatch_layout(command, site)
        rows = thesis[thesis["gpus"] == run.workers]
        assert nodes * tasks == run.workers, (site, command)
        assert tasks <= gpus_per_node and gpus == tasks, (site, command, gpus)
        assert "--base-lr" not in train and "--base-batch" not in train
        batch = int(train[train.index("--per-worker-batch") + 1])
        rule = train[train.index("--lr-scaling") + 1]
        global_batch = batch * nodes * tasks
        assert set(rows["global_batch"]) == {global_batch}, (command, global_batch)
        assert list(rows["lr"]) == pytest.approx([scaled_lr(0.1, 256, global_batch, rule=rule)] * len(rows)), command


def test_the_gpu_request_follows_an_explicit_ntasks_per_node():
    out = _dry_run("thesis-taito", "02_single_node_data_parallel.sbatch", "--ntasks-per-node=2")
    assert "--ntasks-per-node=2 " in out and "--gres=gpu:p100:2 " in out
    assert "--ntasks-per-node=4" not in out and "gpu:p100:4" not in out
    nodes, tasks, gpus, _ = _sbatch_layout("slurm_examples/submit.sh slurm_examples/03_multi_node_horovod.sbatch "
                                           "--workers=12", "gpus-per-node-apptainer")
    assert (nodes, tasks, gpus) == (2, 6, 6)  # 12 on 8-GPU nodes: two nodes of six, not 8 + 4


@pytest.mark.parametrize("args, message", [
    (["03_multi_node_horovod.sbatch", "--workers=7"],
     "error: --workers=7 cannot be spread evenly: it needs 2 nodes of at most 4 task(s) (GUIDE_TASKS_PER_NODE=4 in "),
    (["03_multi_node_horovod.sbatch", "--workers=8", "--nodes=2"],
     "error: --workers=8 sets --nodes and --ntasks-per-node itself; drop --nodes=2"),
    (["03_multi_node_horovod.sbatch", "--workers=0"], "error: --workers=0 must be a positive integer"),
    (["02_single_node_data_parallel.sbatch", "--workers=8"],
     "error: 02_single_node_data_parallel.sbatch runs on one node, but --workers=8 needs 2 nodes"),
])
def test_a_bad_worker_count_is_one_line(args, message):
    out = _submit("thesis-taito", "--dry-run", str(EXAMPLES / args[0]), *args[1:])
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(message), line
    if "evenly" in message:
        assert line.endswith("use --workers=6 or --workers=8")


# -- Portability: bash < 4.4, paths with spaces ------------------------------------------------

def unguarded_array_expansions(text: str, context: str = "") -> list[str]:
    """Expansions "${a[@]}" in ``text`` of arrays that may be empty, which `set -u` turns into
    an 'unbound variable' error on bash < 4.4 (macOS's 3.2, RHEL 7's 4.2): they must be
    written ${a[@]+"${a[@]}"}. An array may be empty unless every assignment to it (in
    ``text`` and the other files, ``context``) starts with a literal word (appends aside)."""

    def code(t: str) -> str:
        lines = (line.split(" #", 1)[0] for line in t.splitlines() if not line.lstrip().startswith("#"))
        return re.sub(r'\$\{(\w+)\[@\]\+"\$\{\1\[@\]\}"\}', "", "\n".join(lines))  # drop the guarded form

    first_words: dict[str, list[str]] = {}
    for name, first in re.findall(r"(?<![\w+])(\w+)=\(\s*(\S?)", code(text + "\n" + context)):
        first_words.setdefault(name, []).append(first)
    for name in re.findall(r"read\s+(?:-\w+\s+)*-a\s+(\w+)", code(text + "\n" + context)):
        first_words.setdefault(name, []).append("")

    def may_be_empty(name: str) -> bool:
        firsts = first_words.get(name)
        return not firsts or any(f in ("", ")", "$", '"') for f in firsts)

    return [m.group(0) for m in re.finditer(r"\$\{(\w+)\[[@*]\]\}", code(text)) if may_be_empty(m.group(1))]


def test_the_array_scanner_finds_what_bash_4_3_rejects():
    assert unguarded_array_expansions('x=()\ncmd "${x[@]}"\n') == ["${x[@]}"]
    assert unguarded_array_expansions('args=("$@")\ncmd "${args[@]}"\n') == ["${args[@]}"]
    assert unguarded_array_expansions('read -r -a x <<<"$s"\ncmd "${x[@]}"\n') == ["${x[@]}"]
    assert unguarded_array_expansions('cmd "${from_elsewhere[@]}"\n') == ["${from_elsewhere[@]}"]
    assert unguarded_array_expansions('x=()\ncmd ${x[@]+"${x[@]}"}\ny=(-a b)\ny+=(c)\ncmd "${y[@]}"\n') == []


@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_no_expansion_of_an_array_that_may_be_empty_is_unguarded(path):
    context = "\n".join(p.read_text() for p in SHELL_FILES if p != path)
    assert unguarded_array_expansions(path.read_text(), context) == [], f"write ${{a[@]+\"${{a[@]}}\"}} in {path.name}"
    # mapfile/readarray -d (a delimiter other than newline) came with bash 4.4 as well.
    assert not re.search(r"^[^#]*\b(mapfile|readarray)\b[^#\n]*\s-d\b", path.read_text(), re.M), path.name


def _source_guide(tmp_path: Path, profile: str, script: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """Run ``script`` after sourcing lib/guide.sh with ``profile`` (outside any job) and a
    fake ``apptainer`` that records each call's argv; (result, recorded argvs)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "apptainer-calls"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" >>"{calls}"\nprintf "\\n" >>"{calls}"\n')
    (bin_dir / "apptainer").chmod(0o755)
    site = tmp_path / "my site.sh"
    site.write_text(profile)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GUIDE_ROOT": str(REPO), "GUIDE_SITE": str(site)}
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    out = subprocess.run(["bash", "-c", f'source "{EXAMPLES}/lib/guide.sh"\nset -euo pipefail\n{script}'],
                         env=env, capture_output=True, text=True, cwd=tmp_path)
    recorded = calls.read_text().split("\n")[:-1] if calls.exists() else []
    return out, [r.split("\0")[:-1] for r in recorded]


APPTAINER_PROFILE = """\
GUIDE_ACCOUNT="" GUIDE_PARTITION="" GUIDE_TASKS_PER_NODE=1 GUIDE_CPUS_PER_TASK=1 GUIDE_GPU_REQUEST=""
GUIDE_SCRATCH=/tmp GUIDE_SOFTWARE=apptainer GUIDE_DATASET_ARCHIVE="" GUIDE_TRAIN_PROFILE=smoke GUIDE_SRUN_MPI=pmix
GUIDE_CONTAINER="{container}"
GUIDE_APPTAINER_FLAGS={flags}
GUIDE_TRAIN_ARGS=() GUIDE_SBATCH_EXTRA=()
"""


def test_container_paths_with_spaces_stay_one_argument(tmp_path):
    """GUIDE_EXEC is built as an array: the image and a bind path with spaces reach apptainer
    as one argument each, for the doctor (asked about this job: PyTorch, DDP) and the launch."""
    container, bind = tmp_path / "my images" / "guide.sif", tmp_path / "node scratch"
    container.parent.mkdir()
    container.write_text("")
    profile = APPTAINER_PROFILE.format(container=container, flags=f'(--nv -B "{bind}")')
    launch = '${GUIDE_EXEC[@]+"${GUIDE_EXEC[@]}"} python -m guide_utils.train "${GUIDE_TRAIN_FLAGS[@]}"'
    out, calls = _source_guide(tmp_path, profile, f"guide_setup pytorch ddp\n{launch}")
    assert out.returncode == 0, out.stderr
    head = ["exec", "--nv", "-B", str(bind), "-B", f"{REPO}/src:/opt/guide/src:ro", str(container), "python", "-m"]
    assert calls[0] == [*head, "guide_utils", "doctor", "--framework", "pytorch", "--dist", "ddp", "--launch", "tasks",
                        "--profile", "smoke"]
    assert calls[1][:len(head) + 3] == [*head, "guide_utils.train", "--profile", "smoke"]
    assert len(calls) == 2


@pytest.mark.parametrize("clean", ["--cleanenv", "-e"])
def test_with_cleanenv_the_commands_reach_apptainer_through_the_variable_passer(tmp_path, clean):
    """--cleanenv in GUIDE_APPTAINER_FLAGS puts lib/apptainer_env.sh before `apptainer exec`
    (tests/test_containers.py checks what it passes); apptainer gets the same arguments."""
    container = tmp_path / "guide.sif"
    container.write_text("")
    profile = APPTAINER_PROFILE.format(container=container, flags=f"({clean} --nv)")
    out, calls = _source_guide(tmp_path, profile, 'guide_setup pytorch ddp\nprintf "%s\\n" "${GUIDE_EXEC[0]}"')
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == str(EXAMPLES / "lib" / "apptainer_env.sh")
    assert calls[0][:6] == ["exec", clean, "--nv", "-B", f"{REPO}/src:/opt/guide/src:ro", str(container)]


@pytest.mark.parametrize("contain", ["--containall", "-C", "--contain", "-c"])
def test_apptainer_flags_that_hide_the_host_folders_are_refused_in_one_line(tmp_path, contain):
    """--contain(all) gives the image no checkout, working directory or /tmp: every job would
    fail after its queue wait writing its results or reading its staged data."""
    container = tmp_path / "guide.sif"
    container.write_text("")
    out, calls = _source_guide(tmp_path, APPTAINER_PROFILE.format(container=container, flags=f"({contain} --nv)"),
                               "guide_setup pytorch ddp")
    assert out.returncode == 2 and not calls
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: GUIDE_APPTAINER_FLAGS in ") and f"has {contain}, which hides" in line


def test_apptainer_flags_as_a_string_are_one_clear_line(tmp_path):
    container = tmp_path / "guide.sif"
    container.write_text("")
    out, calls = _source_guide(tmp_path, APPTAINER_PROFILE.format(container=container, flags='"--nv -B /scratch"'),
                               "guide_setup pytorch ddp")
    assert out.returncode == 2 and not calls
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: GUIDE_APPTAINER_FLAGS in ") and "must be an array" in line


@pytest.mark.parametrize("doctor", ["quick", "fast"])
def test_guide_doctor_quick_reaches_the_doctor_and_a_typo_is_one_line(tmp_path, doctor):
    """GUIDE_DOCTOR=quick adds --quick to the job's doctor call; any other value stops the job
    at the site check, with one line naming the value and the choices."""
    container = tmp_path / "guide.sif"
    container.write_text("")
    profile = APPTAINER_PROFILE.format(container=container, flags="()") + f"GUIDE_DOCTOR={doctor}\n"
    out, calls = _source_guide(tmp_path, profile, "guide_setup pytorch ddp")
    if doctor == "fast":
        assert out.returncode == 2 and not calls
        (line,) = out.stderr.strip().splitlines()
        assert line == f"error: GUIDE_DOCTOR='fast' in {tmp_path / 'my site.sh'} must be full or quick (or unset: full)"
    else:
        assert out.returncode == 0, out.stderr
        (call,) = calls
        assert call[call.index("doctor"):] == ["doctor", "--framework", "pytorch", "--dist", "ddp", "--launch", "tasks",
                                               "--profile", "smoke", "--quick"], call


GPU_PROFILE = APPTAINER_PROFILE.replace('GUIDE_CPUS_PER_TASK=1 GUIDE_GPU_REQUEST=""',
                                        'GUIDE_CPUS_PER_TASK=8 GUIDE_GPU_REQUEST="--gpus-per-node=%d"')


@pytest.mark.parametrize("job, missing", [
    ("", "1 CPU(s) per task where the profile asks 8 and no GPU where the profile asks --gpus-per-node=%d"),
    ("SLURM_CPUS_PER_TASK=8 SLURM_GPUS_ON_NODE=0", "no GPU where the profile asks --gpus-per-node=%d"),
    ("SLURM_CPUS_PER_TASK=8 SLURM_JOB_GPUS=0,1", None),  # plain sbatch given the profile's request
    ("GUIDE_SUBMITTED=submit.sh", None),  # submit.sh's jobs: the profile is in the options
], ids=["bare", "no-gpu", "carried", "submit.sh"])
def test_a_plain_sbatch_job_without_the_sites_request_stops_before_anything_runs(tmp_path, job, missing):
    """`sbatch SCRIPT` gets only the script's #SBATCH lines: at a GPU site it would train on
    the CPU, one CPU per task. Inside such a job guide_setup stops at once, in one line that
    says to use submit.sh, before the doctor or any step; a job of submit.sh, or one whose
    options carried the profile's CPUs per task and GPUs, goes on (to its doctor here)."""
    container = tmp_path / "guide.sif"
    container.write_text("")
    start = f"export SLURM_JOB_ID=5 SLURM_JOB_NAME=01_single_gpu_baseline {job}\nguide_setup pytorch none"
    out, calls = _source_guide(tmp_path, GPU_PROFILE.format(container=container, flags="()"), start)
    if missing is None:
        assert calls and "doctor" in calls[0], out.stderr
        return
    assert out.returncode == 2 and not calls, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line == (f"error: job 5 has {missing} ({tmp_path / 'my site.sh'}): plain sbatch applies none of the site "
                    "profile; submit with slurm_examples/submit.sh slurm_examples/01_single_gpu_baseline.sbatch")


def test_the_warning_reaches_the_engines_processes_and_not_their_launchers():
    """GUIDE_ENGINE_MATCH, the default of guide_signal_training: the training processes as each
    launcher starts them, never the launcher (torchrun and horovodrun die of a USR1, and their
    workers' checkpoint with them) nor a shell around a worker."""
    proc = subprocess.run(["bash", "-c", 'source "$0"; printf "%s\\n" "$GUIDE_ENGINE_MATCH"',
                           str(EXAMPLES / "lib/guide.sh")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GUIDE_ROOT": str(REPO)})
    pattern = proc.stdout.strip()
    assert proc.returncode == 0 and pattern, proc.stderr
    cmdlines = {  # as /proc/PID/cmdline reads, arguments joined by spaces
        "/v/bin/python -m guide_utils.train --profile smoke --dist horovod ": True,  # srun's, mpirun's task
        "/v/bin/python3.11 -u -m guide_utils.train --profile smoke --dist ddp ": True,  # torchrun's worker
        "python -m guide_utils.train_tf --dist mwms ": True,
        "/v/bin/python /v/bin/torchrun --standalone --nproc-per-node=2 -m guide_utils.train --dist ddp ": False,
        "/v/bin/python /v/bin/horovodrun --gloo -np 2 -H localhost:2 python -m guide_utils.train ": False,
        "/bin/sh -c cd /x >/dev/null 2>&1 ; python -m guide_utils.train --dist horovod ": False,  # horovodrun's shell
        "mpirun -np 4 --map-by ppr:2:node python -m guide_utils.train ": False,
        "srun --kill-on-bad-exit=1 python -m guide_utils.train ": False,
        "/r/slurm_examples/lib/apptainer_env.sh apptainer exec x.sif python -m guide_utils.train ": False,
        "python -m guide_utils.trainer ": False,
        "python -m guide_utils task-probe ": False,
    }
    assert {line: bool(re.search(pattern, line)) for line in cmdlines} == cmdlines


FAKE_ENGINE = """\
import pathlib, signal, sys, time
signal.signal(signal.SIGUSR1, lambda *_: pathlib.Path(sys.argv[1]).write_text("USR1"))
print("ready", flush=True)
time.sleep(120)
"""


def _srun_here(empty: Path, opts: Path | None = None) -> str:
    """A bash srun that runs its command here, with nothing on PATH (``empty``), and appends
    each of its options to ``opts``."""
    seen = f'echo "$1" >>"{opts}"; ' if opts else ""
    return (f'srun() {{ while [[ $1 == -* ]]; do {seen}shift; done; '
            f'PATH="{empty}" "{shutil.which("bash")}" "${{@:2}}"; }}')


def test_the_warning_scan_signals_this_jobs_engines_only_and_starts_no_program(tmp_path):
    """guide_signal_training on one node (srun replaced by a function that runs its command
    here): of three real processes, it signals the one whose command line is the engine's and
    whose environment is this job's, not the engine of another job nor another module of this
    one. Its per-node scan runs with no program on PATH: it starts none per process, so a node
    with hundreds of processes is scanned in time (a `tr | grep` each once took longer than
    the warning left, and the training ended unwarned), and its step has a time limit."""
    (tmp_path / "guide_utils").mkdir()  # a stand-in package, imported with -S (no site-packages)
    for module in ("train", "trainer"):
        (tmp_path / "guide_utils" / f"{module}.py").write_text(FAKE_ENGINE)
    procs = {}
    try:
        for name, job, module in (("engine", "77", "train"), ("other_job", "78", "train"), ("other", "77", "trainer")):
            procs[name] = subprocess.Popen(
                [sys.executable, "-S", "-m", f"guide_utils.{module}", str(tmp_path / name)], stdout=subprocess.PIPE,
                text=True, env={**os.environ, "PYTHONPATH": str(tmp_path), "SLURM_JOB_ID": job})
        for proc in procs.values():
            assert proc.stdout.readline() == "ready\n"
        empty = tmp_path / "no-programs"
        empty.mkdir()
        opts = tmp_path / "srun-options" / "seen"
        opts.parent.mkdir()
        stub = _srun_here(empty, opts)
        out, _ = _source_guide_plain(f"{stub}\nguide_signal_training USR1", SLURM_JOB_ID="77",
                                     SLURM_JOB_NUM_NODES="1", SLURMD_NODENAME="node7")
        assert out == "== node7: USR1 sent to 1 training process(es)\n"  # what the job log says
        # Beside the training step, and never holding the batch shell (which waits for it in its
        # trap) past a minute: a scan that hung once kept a job from requeueing.
        assert {"--overlap", "--time=1"} <= set(opts.read_text().split())
        deadline = time.monotonic() + 30
        while not (tmp_path / "engine").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # time for a wrong signal to land too
        assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["engine"]
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_the_warning_scan_ends_when_a_process_goes_while_it_is_read(tmp_path):
    """A process that ends while the scan reads its command line makes every later read of that
    file fail (ESRCH), and a failed read leaves the variable as it was. Here `read` fails for
    good once it has read a word VANISH (a process's command line): the scan must still end,
    where the loop of `read || [[ -n $w ]]` added that word forever (it held a CI job 10 min)."""
    gone = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)", "VANISH"])
    try:
        empty = tmp_path / "no-programs"
        empty.mkdir()
        fake_read = ('read() { [[ -z ${gone:-} ]] || return 1; builtin read "$@" || return; '
                     '[[ ${w:-} != VANISH ]] || gone=1; }; export -f read')
        stub = _srun_here(empty)
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GUIDE_"))}
        scan = subprocess.Popen(["bash", "-c", f'source "{EXAMPLES}/lib/guide.sh"\n{stub}\n{fake_read}\n'
                                 "guide_signal_training USR1"], stdout=subprocess.PIPE, text=True,
                                env={**clean, "GUIDE_ROOT": str(REPO), "SLURM_JOB_ID": "77",
                                     "SLURM_JOB_NUM_NODES": "1", "SLURMD_NODENAME": "node7"},
                                start_new_session=True)
        try:
            out, _ = scan.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(scan.pid, signal.SIGKILL)  # the spinning scan with it
            scan.wait()
            pytest.fail("the scan never ended")
        assert out == "== node7: USR1 sent to 0 training process(es)\n", out
    finally:
        gone.kill()
        gone.wait()


def _wait_for(path: Path, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


def test_the_warning_scan_looks_through_wrappers_and_spares_the_batch_shell_the_holder_and_itself(tmp_path):
    """What `bash train.sh` used to become, a pattern that matches every bash of the job: a
    batch shell warned (USR1, as Slurm sends it) passes the warning on without being signalled
    again itself (it would re-enter its trap), and neither the scratch holder (it would die)
    nor the scan (it would kill itself) is signalled; the wrapper is looked through to the
    Python program it runs as its child, which alone gets the warning. A wrapper that execs
    (`./select_gpu python execd.py`, LUMI's) is matched by the program it became."""
    fake, execd = tmp_path / "fake.py", tmp_path / "execd.py"
    fake.write_text(FAKE_ENGINE)
    execd.write_text(FAKE_ENGINE)
    (tmp_path / "train.sh").write_text(f'"{sys.executable}" -S "{fake}" "$1"\n')
    select = tmp_path / "select_gpu"
    select.write_text('#!/bin/bash\nexport ROCR_VISIBLE_DEVICES=0\nexec "$@"\n')
    select.chmod(0o755)
    empty = tmp_path / "no-programs"
    empty.mkdir()
    (tmp_path / "batch.sh").write_text(
        f'source "{EXAMPLES}/lib/guide.sh"\n{_srun_here(empty)}\n'
        f'trap \'echo USR1 >>"{tmp_path}/batch"; ((++n > 1)) || guide_signal_training USR1 >"{tmp_path}/scan"\' USR1\n'
        'echo ready\nwhile :; do sleep 0.1; done\n')
    job = {**{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GUIDE_"))}, "SLURM_JOB_ID": "77",
           "SLURM_JOB_NUM_NODES": "1", "SLURMD_NODENAME": "node7", "GUIDE_ROOT": str(REPO)}
    bash = shutil.which("bash")
    procs = {}

    def start(name: str, argv: list[str], **env: str) -> None:
        procs[name] = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env={**job, **env},
                                       start_new_session=True)

    try:
        start("batch", [bash, str(tmp_path / "batch.sh")], GUIDE_SIGNAL_MATCH="^([^ ]*/)?bash( |$)")
        start("holder", [bash, str(EXAMPLES / "lib/stage_node.sh"), "hold", str(tmp_path / "guide-77")],
              GUIDE_SCRATCH_HOLDER="77")
        start("wrapper", [bash, str(tmp_path / "train.sh"), str(tmp_path / "child")])
        start("exec", [str(select), sys.executable, "-S", str(execd), str(tmp_path / "execd")])
        for name in ("batch", "wrapper", "exec"):
            assert procs[name].stdout.readline() == "ready\n", name
        procs["batch"].send_signal(signal.SIGUSR1)
        assert _wait_for(tmp_path / "scan") and _wait_for(tmp_path / "child")
        time.sleep(1)  # time for a wrong signal to land too
        assert (tmp_path / "scan").read_text() == "== node7: USR1 sent to 1 training process(es)\n"
        assert (tmp_path / "batch").read_text() == "USR1\n"  # Slurm's, and no second one
        assert procs["holder"].poll() is None and procs["wrapper"].poll() is None
        assert not (tmp_path / "execd").exists()  # another command's program
        match, _ = _source_guide_plain(f"guide_command_match {shlex.join([str(select), 'python', str(execd), 'x'])}")
        out, _ = _source_guide_plain(f"{_srun_here(empty)}\nguide_signal_training USR1", SLURM_JOB_ID="77",
                                     SLURM_JOB_NUM_NODES="1", SLURMD_NODENAME="node7", GUIDE_SIGNAL_MATCH=match.strip())
        assert out == "== node7: USR1 sent to 1 training process(es)\n" and _wait_for(tmp_path / "execd")
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_the_warning_spares_the_stream_filters_of_a_wrappers_pipeline(tmp_path):
    """`bash train.sh` whose script runs `python train.py | tee log`: the wrapper is looked
    through to its program alone; tee, a filter of the pipeline, is not signalled (it would die of
    USR1, and the program of a broken pipe before it saved)."""
    fake = tmp_path / "fake.py"
    fake.write_text(FAKE_ENGINE)
    (tmp_path / "train.sh").write_text(f'"{sys.executable}" -S "{fake}" "$1" | tee "$2"\n')
    empty = tmp_path / "no-programs"
    empty.mkdir()
    job = {**{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GUIDE_"))}, "SLURM_JOB_ID": "77"}
    wrapper = subprocess.Popen(["bash", str(tmp_path / "train.sh"), str(tmp_path / "child"), str(tmp_path / "log")],
                               env=job, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while "ready" not in ((tmp_path / "log").exists() and (tmp_path / "log").read_text() or ""):
            assert time.monotonic() < deadline, "the wrapper's program never started"
            time.sleep(0.05)
        (tee,) = [p for p in _children(wrapper.pid) if Path(f"/proc/{p}/comm").read_text().strip() == "tee"]
        match, _ = _source_guide_plain(f"guide_command_match bash {shlex.quote(str(tmp_path / 'train.sh'))} x y")
        out, _ = _source_guide_plain(f"{_srun_here(empty)}\nguide_signal_training USR1", SLURM_JOB_ID="77",
                                     SLURM_JOB_NUM_NODES="1", SLURMD_NODENAME="node7", GUIDE_SIGNAL_MATCH=match.strip())
        assert out == "== node7: USR1 sent to 1 training process(es)\n" and _wait_for(tmp_path / "child")
        time.sleep(0.5)  # time for a wrong signal to land too
        assert Path(f"/proc/{tee}").exists() and wrapper.poll() is None
    finally:
        os.killpg(wrapper.pid, signal.SIGKILL)
        wrapper.wait()


def test_a_warning_that_matches_nothing_goes_to_the_srun_of_the_training_tasks(tmp_path):
    """A script that execs a program its command does not name (`bash train.sh` doing `exec
    python train.py`) leaves no process to match: where the tasks are an srun's, that srun (a
    stand-in here) gets the warning, and srun passes it on to the programs its tasks became.
    Where the scan found the training, or no srun is named, nothing else is signalled."""
    empty = tmp_path / "no-programs"
    empty.mkdir()
    fake = tmp_path / "fake.py"
    fake.write_text(FAKE_ENGINE)
    job = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "1", "SLURMD_NODENAME": "node7"}
    stand_in = subprocess.Popen([sys.executable, "-S", str(fake), str(tmp_path / "srun")], stdout=subprocess.PIPE,
                                text=True, env={**os.environ, **job})
    try:
        assert stand_in.stdout.readline() == "ready\n"
        scan = f"{_srun_here(empty)}\nguide_signal_training USR1"
        out, _ = _source_guide_plain(scan, GUIDE_SIGNAL_MATCH="^nothing-runs-this( |$)", **job)
        assert out == "== node7: USR1 sent to 0 training process(es)\n"  # no srun named: nothing more
        matched = f"^([^ ]*/)?python[0-9.]*( -[^ ]+)* {re.escape(str(fake))}( |$)"
        out, _ = _source_guide_plain(f"{scan} {stand_in.pid}", GUIDE_SIGNAL_MATCH=matched, **job)
        assert out == "== node7: USR1 sent to 1 training process(es)\n" and _wait_for(tmp_path / "srun")
        (tmp_path / "srun").unlink()  # the scan's own signal; the srun got none besides
        out, _ = _source_guide_plain(f"{scan} {stand_in.pid}", GUIDE_SIGNAL_MATCH="^nothing-runs-this( |$)", **job)
        assert out.splitlines() == ["== node7: USR1 sent to 0 training process(es)",
                                    "== no process was signalled; USR1 sent to the training's srun, which "
                                    "passes it on to its tasks"]
        assert _wait_for(tmp_path / "srun")
    finally:
        stand_in.kill()
        stand_in.wait()


def test_a_failed_warning_scan_still_warns_the_srun_and_asks_no_gpus(tmp_path):
    """The scan step is started without the GPU request sbatch exported (srun of Slurm 22.05 to
    23.02.4 makes SLURM_GPUS_PER_NODE the step's own request and then refuses it beside
    --gres=none: the step fails); a scan that fails anyway still sends the warning to the srun
    of the training tasks (a stand-in process here) instead of to nobody."""
    empty = tmp_path / "no-programs"
    empty.mkdir()
    seen = tmp_path / "env"
    failing = f'srun() {{ echo "${{SLURM_GPUS_PER_NODE-unset}} ${{SLURM_GPUS-unset}}" >"{seen}"; return 1; }}'
    stand_in = subprocess.Popen(["sleep", "60"])
    try:
        out, err = _source_guide_plain(f"{failing}\nguide_signal_training USR1 {stand_in.pid}", SLURM_JOB_ID="77",
                                       SLURM_JOB_NUM_NODES="1", SLURM_GPUS_PER_NODE="4", SLURM_GPUS="8",
                                       GUIDE_SIGNAL_MATCH="^nothing( |$)")
        assert seen.read_text() == "unset unset\n"
        assert "could not signal every node (srun exit 1)" in err
        assert "USR1 sent to the training's srun" in out
        assert stand_in.wait(timeout=10) == -signal.SIGUSR1
    finally:
        stand_in.kill()
        stand_in.wait()


@pytest.mark.parametrize("body, why", [
    ("#!/bin/bash\ntorchrun --nproc-per-node=4 train.py\n", "starts a launcher itself (line 2"),
    ("#!/bin/bash\n# srun is not here\n  exec mpirun -np 2 python train.py\n", "starts a launcher itself (line 3"),
    ("python -m torch.distributed.run --nproc-per-node=4 train.py\n", "starts a launcher itself (line 1"),
    ("set -e\nOMP_NUM_THREADS=8 torchrun train.py\n", "starts a launcher itself (line 2"),
    ("env NCCL_DEBUG=WARN torchrun train.py\n", "starts a launcher itself (line 1"),
    ("python3 -u -m deepspeed.launcher.runner train.py\npython -u -m horovod.runner -np 2 python t.py\n",
     "starts a launcher itself (line 2"),
])
def test_a_wrapper_script_that_starts_a_launcher_is_refused_before_it_queues(tmp_path, body, why):
    """`bash train.sh` where train.sh starts torchrun (or mpirun...): the warning would reach the
    launcher, which dies of it with its workers and no checkpoint; one line, nothing submitted.
    A launcher named in a comment is not one."""
    script = tmp_path / "train.sh"
    script.write_text(body)
    out = _submit("ci", "--dry-run", str(EXAMPLES / "16_your_own_script.sbatch"), "--", "bash", str(script))
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"error: {script} {why}"), line
    script.write_text("#!/bin/bash\n# not srun: python alone\npython train.py | tee log\n")
    out = _submit("ci", "--dry-run", str(EXAMPLES / "16_your_own_script.sbatch"), "--", "bash", str(script))
    assert out.returncode == 0 and out.stderr == "", out.stderr


def test_an_interpreter_flag_with_its_value_apart_is_refused():
    """`python -W ignore train.py`: the warning would take "ignore" for the script (and the
    process pattern would not match); one line asks for -Wignore. The one-word form passes."""
    script = str(EXAMPLES / "16_your_own_script.sbatch")
    out = _submit("ci", "--dry-run", script, "--", "python", "-W", "ignore", "train.py")
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert "(-Wignore)" in line, line
    out = _submit("ci", "--dry-run", script, "--", "python", "-Wignore", "train.py")
    assert out.returncode == 0 and out.stderr == "", out.stderr


def test_the_variable_passer_takes_the_slingshot_and_rocm_settings_into_the_image():
    """apptainer_env.sh (before `apptainer exec --cleanenv`): libfabric's (FI_*), Cray MPICH's,
    ROCm's (HSA_*, MIOPEN_*) and NCCL's settings and PYTHONUNBUFFERED reach the image; the
    host's library and Python paths do not."""
    given = {"FI_CXI_DISABLE_HOST_REGISTER": "1", "MPICH_GPU_SUPPORT_ENABLED": "1", "HSA_FORCE_FINE_GRAIN_PCIE": "1",
             "MIOPEN_USER_DB_PATH": "/tmp/miopen", "NCCL_NET": "AWS Libfabric", "PYTHONUNBUFFERED": "1",
             "LD_LIBRARY_PATH": "/opt/host/lib", "PYTHONPATH": "/opt/host/py"}
    out = subprocess.run([str(EXAMPLES / "lib/apptainer_env.sh"), "env"], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], **given}, timeout=60)
    assert out.returncode == 0, out.stderr
    passed = dict(line.removeprefix("APPTAINERENV_").split("=", 1) for line in out.stdout.splitlines()
                  if line.startswith("APPTAINERENV_"))
    assert passed == {k: v for k, v in given.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}


# What srun reads for its CPUs per task, by Slurm version (guide_srun_cpu_env), and what mpirun
# gets for its per-node daemons: checked against src/srun/opt.c and src/common/env.c at the tags
# slurm-21-08-8-2, 22-05-8-1, 23-02-7-1, 23-11-0-1 and 24-11-0-1, and CHANGELOG/slurm-22.05.md
# and slurm-23.11.md. Only 22.05 runs here (the test Slurm); the other rows are the documented ones.
SLURM_RULES = {
    "21.08": ([], ["OMPI_MCA_plm_slurm_args=--cpus-per-task=16", "PRTE_MCA_plm_slurm_args=--cpus-per-task=16"]),
    "22.05": (["SRUN_CPUS_PER_TASK=4"], ["SRUN_CPUS_PER_TASK=4", "OMPI_MCA_plm_slurm_args=--cpus-per-task=16",
                                         "PRTE_MCA_plm_slurm_args=--cpus-per-task=16"]),
    "23.02": (["SRUN_CPUS_PER_TASK=4"], ["SRUN_CPUS_PER_TASK=4", "OMPI_MCA_plm_slurm_args=--cpus-per-task=16",
                                         "PRTE_MCA_plm_slurm_args=--cpus-per-task=16"]),
    "23.11": ([], []),  # srun reads SLURM_CPUS_PER_TASK again; mpirun's srun is an --external-launcher step
    "24.11": ([], []),
}


@pytest.mark.parametrize("version", sorted(SLURM_RULES))
def test_the_cpus_of_srun_steps_follow_the_slurm_version(version):
    """4 CPUs per task, 4 tasks per node: srun tasks (and a launcher per node, whose srun line
    names its CPUs itself) need SRUN_CPUS_PER_TASK only where srun reads nothing else; mpirun's
    daemons get the node's 16 CPUs on their srun line until Slurm starts them itself."""
    tasks, shell = SLURM_RULES[version]
    script = f'guide_srun_cpu_env {version} 4 4 tasks; echo --; guide_srun_cpu_env {version} 4 4 shell'
    out, _ = _source_guide_plain(script)
    assert out.split("--\n") == ["".join(f"{line}\n" for line in lines) for lines in (tasks, shell)]


def test_the_jobs_own_slurm_version_decides(tmp_path):
    """Inside a job, guide_task_options asks this Slurm's srun for its version: under 23.11 no
    SRUN_CPUS_PER_TASK is exported (srun no longer reads it) and mpirun's srun gets Slurm's own
    --external-launcher, which a site's value of OMPI_MCA_plm_slurm_args keeps."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\n[ "$1" = --version ] && echo "slurm 23.11.4"\n')
    (bin_dir / "srun").chmod(0o755)
    job = ("export SLURM_JOB_ID=5 SLURM_NTASKS=8 SLURM_JOB_NUM_NODES=2 SLURM_CPUS_PER_TASK=4 "
           "OMPI_MCA_plm_slurm_args=--external-launcher; GUIDE_SITE_FILE=x GUIDE_GPU_REQUEST= GUIDE_EXEC=() "
           "GUIDE_DIST=horovod GUIDE_LAUNCH=shell GUIDE_SRUN_MPI=pmix; guide_task_options; "
           'echo "${SRUN_CPUS_PER_TASK:-unset} $OMPI_MCA_plm_slurm_args $OMP_NUM_THREADS"')
    out, _ = _source_guide_plain(job, PATH=f"{bin_dir}:{os.environ['PATH']}")
    assert out.strip() == "unset --external-launcher 4"


def _source_guide_plain(script: str, **env: str) -> tuple[str, str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("SLURM_", "SRUN_", "OMPI_MCA_plm", "GUIDE_", "OMP_NUM_THREADS"))}
    out = subprocess.run(["bash", "-c", f'source "{EXAMPLES}/lib/guide.sh"\nset -euo pipefail\n{script}'],
                         env={**clean, "GUIDE_ROOT": str(REPO), **env}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout, out.stderr


def test_a_launcher_per_node_keeps_the_union_of_wide_cpu_masks():
    """A node of more than 64 CPUs (or hardware threads) has masks wider than bash's 64-bit
    arithmetic: the union of the first tasks' masks is taken digit by digit, none dropped."""
    masks = "0xff,0xff00,0xff0000000000000000,0xff000000000000000000"
    out, _ = _source_guide_plain(f'GUIDE_SRUN_ARGS=("--cpu-bind=mask_cpu:{masks}"); guide_node_cpu_bind 4; '
                                 'guide_node_cpu_bind 2; guide_hex_or 0x0f 0XF0; guide_hex_or 0 0')
    assert out.split() == ["--cpu-bind=mask_cpu:0xffff000000000000ffff", "--cpu-bind=mask_cpu:0xffff", "ff", "0"]
    assert int("ffff000000000000ffff", 16) == sum(int(m, 16) for m in masks.split(","))


def test_each_task_of_an_array_in_a_chain_keeps_its_own_checkpoints():
    """04-07 submitted through chain.sh: one chain folder, a folder per array task in it (the
    tasks are runs of different batch sizes); a job outside a chain has its own by job id."""
    script = ("guide_checkpoint_dir; SLURM_ARRAY_TASK_ID=2; guide_checkpoint_dir; GUIDE_CHAIN_CHECKPOINTS=; "
              "guide_checkpoint_dir")
    out, _ = _source_guide_plain(script, GUIDE_CHAIN_CHECKPOINTS="/s/chain-1", SLURM_JOB_NAME="04_naive_scaling",
                                 SLURM_JOB_ID="77", GUIDE_CHECKPOINT_ROOT="/s/ck")
    assert out.split() == ["/s/chain-1", "/s/chain-1/task-2", "/s/ck/04_naive_scaling-77"]


def test_a_warning_during_the_set_up_ends_the_job_with_one_line_not_a_silent_138(tmp_path):
    """A --time shorter than the set-up plus the warning: USR1 reaches the batch shell before
    the launch. The shell survives it (bash's default would end it with 138 and no word), the
    set-up goes on, and the launch stops with one line instead of training to be warned at once."""
    marker = tmp_path / "launched"
    script = (f'source "{EXAMPLES}/lib/guide.sh"\nset -euo pipefail\nguide_note_early_warning\nkill -USR1 $$\n'
              f'echo "set-up goes on"\nguide_run_requeueable touch "{marker}"\n')
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "GUIDE_ROOT": str(REPO)})
    assert out.returncode == 2 and not marker.exists(), out
    assert out.stdout.splitlines() == ["== USR1 during the set-up: the time limit is near", "set-up goes on"]
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: Slurm's time-limit warning came before the training started") and "--time" in line


@pytest.mark.parametrize("command, expected", [
    (["python", "train.py", "--epochs", "3"], ["train.py", "--epochs", "3"]),
    (["/usr/bin/python3", "-u", "train.py", "-u"], ["train.py", "-u"]),
    (["python", "-u", "-m", "my.train", "-x"], ["-m", "my.train", "-x"]),
    (["./bin/train", "a b"], ["--no-python", "./bin/train", "a b"]),
])
def test_torchrun_gets_the_readers_command_without_the_interpreter(command, expected):
    proc = subprocess.run(["bash", "-c", f'source "{EXAMPLES}/lib/guide.sh"\nguide_torchrun_args "$@"', "x", *command],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "GUIDE_ROOT": str(REPO)})
    assert proc.returncode == 0 and proc.stdout.split("\0")[:-1] == expected, proc


@pytest.mark.parametrize("site, shared, whole", [
    ("thesis-taito", "--partition=gpu --mem=60G", "--mem=0"),
    ("gpus-per-node-apptainer", "--partition=gpu --mem-per-gpu=60G", "--exclusive"),
])
def test_a_one_gpu_job_is_not_billed_a_whole_node(site, shared, whole):
    """The single-GPU baseline at a site of 4 or 8 GPUs per node asks for its share (the
    profile's GUIDE_SHARED_SBATCH), not the node's memory or the node itself; 03 still does."""
    one = _dry_run(site, "01_single_gpu_baseline.sbatch")
    assert shared in one and whole not in one, one
    assert whole in _dry_run(site, "03_multi_node_horovod.sbatch")


def test_the_scripts_that_read_no_dataset_stage_none():
    """10's benchmark and 09's notebooks are given no --data: GUIDE_STAGE=no before the set-up
    (a copy of ImageNet to every node would be time and file-system bandwidth for nothing)."""
    for script in SCRIPTS:
        text = script.read_text()
        reads_data = "GUIDE_TRAIN_FLAGS" in text or "{data}" in text
        assert ("GUIDE_STAGE=no" in text) == (not reads_data), script.name


@pytest.mark.parametrize("request_, gres", [("--gres=gpu:v100:%d,nvme:200", "gpu:4"), ("--gres=shard:%d", "shard:4"),
                                            ("--gpus-per-node=%d", "gpu:4"), ("--gpus-per-task=1", "gpu:4"),
                                            ("--gpus-per-node=%d --gres=nvme:200", "gpu:4"),
                                            ("--gres=nvme:200,gpu:a100:%d", "gpu:4")])
def test_a_launcher_per_node_asks_for_the_nodes_gpus_in_the_sites_gres(request_, gres):
    """torchrun's step (one task per node) asks for the node's GPUs itself, in the GRES the
    profile's request names: at a site that shares GPUs as shards, a gpu request is refused."""
    job = ("export SLURM_JOB_ID=5 SLURM_NTASKS=8 SLURM_JOB_NUM_NODES=2 SLURM_CPUS_PER_TASK=4; GUIDE_SITE_FILE=x "
           f"GUIDE_GPU_REQUEST='{request_}' GUIDE_EXEC=() GUIDE_DIST=ddp GUIDE_LAUNCH=node GUIDE_SRUN_MPI=pmix; "
           'guide_task_options; printf "%s\\n" "${GUIDE_SRUN_NODES[@]}"')
    out, _ = _source_guide_plain(job, PATH=f"/nonexistent:{os.environ['PATH']}")
    assert f"--gres={gres}" in out.split() and "--cpus-per-task=16" in out.split(), out


# -- One launcher per node where the GPUs are asked per task (torchrun under --gpus-per-task) ----
# What a job asked with --gpus-per-task hands its steps, and what srun makes of it, as Slurm's
# source reads at the tags slurm-22-05-8-1 and slurm-23-11-0-1 (the test Slurm is 22.05; the
# 23.11 rows are emulated here): sbatch exports SLURM_GPUS_PER_TASK (22.05, 23.02) or
# SLURM_TRES_PER_TASK and SLURM_TRES_BIND (23.11 on, src/common/env.c); srun reads them as its
# own options, and with no binding named binds each task to its GPUs: "gpu:per_task:N" at 22.05
# (src/srun/libsrun/launch.c), "gres/gpu:per_task:N" from 23.11 (_implicitly_bind_tres_per_task);
# --gpu-bind on the command line replaces the inherited binding (arg_set_gpu_bind).
JOB_ENV = {
    "22.05": {"SLURM_GPUS_PER_TASK": "1"},
    "23.11": {"SLURM_TRES_PER_TASK": "cpu:32,gres/gpu:1", "SLURM_TRES_BIND": "gres/gpu:per_task:1"},
    "24.05": {"SLURM_TRES_PER_TASK": "cpu=32,gres/gpu=1", "SLURM_TRES_BIND": "gres/gpu:per_task:1"},
}


def srun_gpu_binding(argv: list[str], env: dict[str, str], version: str) -> str:
    """The GPU binding srun gives a step, from its options and the environment (a stand-in)."""
    given = [a.split("=", 1)[1] for a in argv if a.startswith("--gpu-bind=")]
    if version == "22.05":
        per_task = env.get("SLURM_GPUS_PER_TASK", "")
        bind = f"gpu:{given[-1]}" if given else (f"gpu:{env['SLURM_GPU_BIND']}" if "SLURM_GPU_BIND" in env else "")
        return bind or (f"gpu:per_task:{per_task.split(':')[-1]}" if per_task else "")
    bind = f"gres/gpu:{given[-1]}" if given else env.get("SLURM_TRES_BIND", "")
    per_task = re.search(r"gres[/:]gpu(?::[\w.-]+)?[:=](\d+)", env.get("SLURM_TRES_PER_TASK", ""))
    return bind if "gpu" in bind or not per_task else f"gres/gpu:per_task:{per_task.group(1)}"


def _node_step(request: str, **job: str) -> list[str]:
    script = ("export SLURM_JOB_ID=5 SLURM_NTASKS=8 SLURM_JOB_NUM_NODES=2 SLURM_CPUS_PER_TASK=32; GUIDE_SITE_FILE=x "
              f"GUIDE_GPU_REQUEST='{request}' GUIDE_EXEC=() GUIDE_DIST=ddp GUIDE_LAUNCH=node GUIDE_SRUN_MPI=pmix; "
              'guide_task_options; printf "%s\\n" "${GUIDE_SRUN_NODES[@]}"')
    out, _ = _source_guide_plain(script, PATH=f"/nonexistent:{os.environ['PATH']}", **job)
    return out.split()


@pytest.mark.parametrize("version", sorted(JOB_ENV))
def test_one_launcher_per_node_sees_every_gpu_of_its_node_where_gpus_are_asked_per_task(version):
    """The job's per-task request reaches torchrun's step from the environment, as sbatch
    exported it, with an implicit binding of each task to one GPU: the step asks for the node's
    four GPUs and names --gpu-bind=none, which replaces that binding in every version; without
    it the step would inherit per_task:1. A job that asks per node gets no binding either way."""
    env = JOB_ENV[version]
    step = _node_step("--gpus-per-task=1", **env)
    assert "--gres=gpu:4" in step and "--gpu-bind=none" in step, step
    assert srun_gpu_binding(step, env, version).endswith(":none")
    bare = [a for a in step if a != "--gpu-bind=none"]
    assert srun_gpu_binding(bare, env, version).endswith("gpu:per_task:1")
    # A plain sbatch --gpus-per-task=2 at a site whose profile asks per node: the job's count decides.
    two = {k: v.replace("1", "2") for k, v in env.items()}
    step = _node_step("--gpus-per-node=%d", **two)
    assert "--gres=gpu:8" in step and srun_gpu_binding(step, two, version).endswith(":none"), step
    step = _node_step("--gpus-per-node=%d")
    assert "--gres=gpu:4" in step and "--gpu-bind=none" not in step and srun_gpu_binding(step, {}, version) == ""


@pytest.mark.parametrize("version, job_env, request_, expected", [
    ("22.05", {"SLURM_GPUS_PER_TASK": "1"}, "--gpus-per-task=1", "--cpus-per-task=16 --gres=gpu:4 --gpu-bind=none"),
    ("23.02", {"SLURM_GPUS_PER_TASK": "1"}, "--gpus-per-task=1", "--cpus-per-task=16 --gres=gpu:4 --gpu-bind=none"),
    ("22.05", {}, "--gpus-per-node=%d", "--cpus-per-task=16"),  # per node: every rank sees the node's GPUs
    ("23.11", JOB_ENV["23.11"], "--gpus-per-task=1", "--external-launcher"),  # Slurm's own step for mpirun
])
def test_mpiruns_daemon_step_asks_for_the_nodes_gpus_where_gpus_are_asked_per_task(tmp_path, version, job_env,
                                                                                   request_, expected):
    """mpirun in the batch shell (03, 16 with LAUNCHER=mpirun) starts one daemon per node with a
    plain srun, which would inherit the job's per-task request and binding: one GPU for all the
    node's ranks. Before 23.11 its srun line (OMPI_/PRTE_MCA_plm_slurm_args) asks for the node's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f'#!/bin/sh\n[ "$1" = --version ] && echo "slurm {version}.4"\n')
    (bin_dir / "srun").chmod(0o755)
    site = "OMPI_MCA_plm_slurm_args=--external-launcher " if version == "23.11" else ""
    script = (f"export SLURM_JOB_ID=5 SLURM_NTASKS=8 SLURM_JOB_NUM_NODES=2 SLURM_CPUS_PER_TASK=4 {site}; "
              f"GUIDE_SITE_FILE=x GUIDE_GPU_REQUEST='{request_}' GUIDE_EXEC=() GUIDE_DIST=horovod GUIDE_LAUNCH=shell "
              'GUIDE_SRUN_MPI=pmix; guide_task_options; echo "$OMPI_MCA_plm_slurm_args"; '
              'echo "${PRTE_MCA_plm_slurm_args:-unset}"')
    out, _ = _source_guide_plain(script, PATH=f"{bin_dir}:{os.environ['PATH']}", **job_env)
    ompi, prte = out.splitlines()
    assert ompi == expected and prte == (expected if version != "23.11" else "unset")
    if "--gpu-bind=none" in expected:
        assert srun_gpu_binding(ompi.split(), job_env, version).endswith(":none")


@pytest.mark.parametrize("node, job, threads", [
    ("CPUTot=128 Sockets=1 Boards=1 CoresPerSocket=64 ThreadsPerCore=2", "", "16"),  # Perlmutter: threads are CPUs
    ("CPUTot=64 Sockets=1 Boards=1 CoresPerSocket=64 ThreadsPerCore=2", "", "32"),  # cores are CPUs
    ("CPUTot=128 Sockets=1 Boards=1 CoresPerSocket=64 ThreadsPerCore=2", "SLURM_THREADS_PER_CORE=1", "32"),
    ("CPUTot=40 Sockets=2 Boards=1 CoresPerSocket=20 ThreadsPerCore=1", "", "32"),  # no SMT
    (None, "", "32"),  # scontrol cannot say
])
def test_omp_threads_are_the_tasks_physical_cores(tmp_path, node, job, threads):
    """OMP_NUM_THREADS (PyTorch's intra-op threads too) is one per physical core of a task of
    32 Slurm CPUs: half that where Slurm counts each core's two hardware threads as CPUs, all of
    them where it counts cores or the job asked one thread per core; a profile's own value wins."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "NodeName=$4 Arch=x86_64 {node}"\n' if node else
                                      "#!/bin/sh\nexit 1\n")
    (bin_dir / "scontrol").chmod(0o755)
    script = (f"export SLURM_JOB_ID=5 SLURM_NTASKS=8 SLURM_JOB_NUM_NODES=2 SLURM_CPUS_PER_TASK=32 {job}; "
              "GUIDE_SITE_FILE=x GUIDE_GPU_REQUEST= GUIDE_EXEC=() GUIDE_DIST=ddp GUIDE_LAUNCH=tasks "
              'GUIDE_SRUN_MPI=pmix; guide_task_options; echo "$OMP_NUM_THREADS"; unset OMP_NUM_THREADS; '
              'OMP_NUM_THREADS=5 guide_task_options; echo "$OMP_NUM_THREADS"')
    out, _ = _source_guide_plain(script, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURMD_NODENAME="nid001")
    assert out.split() == [threads, "5"]


def test_the_submit_sh_mark_does_not_reach_a_plain_sbatch_from_inside_the_job(tmp_path):
    """GUIDE_SUBMITTED says that this job's options came from the profile. Once the job has
    read it, it is gone from the job's environment: a plain `sbatch` run from inside (a
    notebook's cell, your command in 16) gets checked like any other."""
    container = tmp_path / "guide.sif"
    container.write_text("")
    start = ("export SLURM_JOB_ID=5 SLURM_JOB_NAME=01_single_gpu_baseline GUIDE_SUBMITTED=submit.sh\n"
             'guide_load_site; guide_check_request; echo "trusted, mark: ${GUIDE_SUBMITTED:-none}"\n'
             'env | grep -c "^GUIDE_SUBMITTED=" || true\nguide_check_request')
    out, _ = _source_guide(tmp_path, GPU_PROFILE.format(container=container, flags="()"), start)
    assert out.stdout.splitlines() == ["trusted, mark: none", "0"], out
    # A second look (what a job started by that inner sbatch does) finds no mark: checked, and stopped.
    assert out.returncode == 2 and "plain sbatch applies none of the site profile" in out.stderr, out


def test_a_variable_the_job_does_not_set_in_a_profile_is_one_line():
    """The Apptainer profiles name $LOCAL_SCRATCH, a placeholder for the centre's node-local
    disk: in a job without it the profile stops the job with one line naming the variable and
    the line, not with bash's "unbound variable" and status 1."""
    site = EXAMPLES / "sites" / "apptainer-example.sh"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GUIDE_")) and k != "LOCAL_SCRATCH"}
    out = subprocess.run(["bash", "-c", f'source "{EXAMPLES}/lib/guide.sh"\nset -euo pipefail\nguide_load_site'],
                         env={**env, "GUIDE_ROOT": str(REPO), "GUIDE_SITE": str(site), "SLURM_JOB_ID": "5"},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == "", out
    (line,) = out.stderr.strip().splitlines()
    number = next(i for i, text in enumerate(site.read_text().splitlines(), 1) if "$LOCAL_SCRATCH" in text)
    assert line == (f"error: site profile {site} line {number} uses $LOCAL_SCRATCH, which this job does not set; "
                    "name your centre's variable for it, or write ${LOCAL_SCRATCH:-} where it may be unset"), line


def _data_site(tmp_path: Path, archive: str) -> str:
    """The CI profile at the full profile, with ``archive`` as its dataset archive."""
    path = tmp_path / "full.sh"
    path.write_text((EXAMPLES / "sites/ci.sh").read_text() + f'GUIDE_TRAIN_PROFILE=full\nGUIDE_DATASET_ARCHIVE="{archive}"\n')
    return str(path)


@pytest.mark.parametrize("archive, flags, words", [
    ("", [], "the full profile trains on ImageNet and this job would get no dataset"),
    ("", ["--epochs", "1", "--profile=full"], "pass -- --data DIR"),
    ("/nonexistent/ilsvrc2012.tar", ["--data", "synthetic"], "dataset archive /nonexistent/ilsvrc2012.tar not found"),
])
def test_a_training_job_without_its_data_is_refused_before_the_queue(tmp_path, archive, flags, words):
    """The job would stop at its first line after its wait in the queue: submit.sh stops it
    first, in one line, and never calls sbatch (a stand-in that would leave a mark)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\ntouch {tmp_path / 'queued'}\n")
    (bin_dir / "sbatch").chmod(0o755)
    env = {**os.environ, "GUIDE_SITE": _data_site(tmp_path, archive), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "GUIDE_LOG_DIR": str(tmp_path / "logs")}
    out = subprocess.run([str(EXAMPLES / "submit.sh"), str(EXAMPLES / "03_multi_node_horovod.sbatch"), "--", *flags],
                         env=env, capture_output=True, text=True, cwd=REPO)
    (line,) = out.stderr.strip().splitlines()
    assert out.returncode == 2 and line.startswith("error: ") and words in line, out.stderr
    assert "GUIDE_DATASET_ARCHIVE" in line and str(tmp_path / "full.sh") in line
    assert not (tmp_path / "queued").exists()


def test_a_dry_run_warns_of_missing_data_and_a_job_that_has_its_data_is_not_stopped(tmp_path):
    no_data = _data_site(tmp_path, "")
    out = _submit(no_data, "--dry-run", str(EXAMPLES / "01_single_gpu_baseline.sbatch"))
    assert out.returncode == 0 and "01_single_gpu_baseline.sbatch" in out.stdout, out.stderr
    assert out.stderr.startswith("warning: the full profile trains on ImageNet"), out.stderr
    # data given, another profile, or a program that reads none: nothing to say
    for script, flags in [("01_single_gpu_baseline.sbatch", ["--data", "/data/imagenet"]),
                          ("08_tensorflow_native.sbatch", ["--data=synthetic"]),
                          ("04_naive_scaling.sbatch", ["--profile", "smoke"]),
                          ("10_communication.sbatch", [])]:
        out = _submit(no_data, "--dry-run", str(EXAMPLES / script), "--", *flags)
        assert out.returncode == 0 and out.stderr == "", (script, out.stderr)
    # a dry run may be planned away from the cluster: the archive's path is left to the job
    out = _submit(_data_site(tmp_path, "/nonexistent/ilsvrc2012.tar"), "--dry-run",
                  str(EXAMPLES / "01_single_gpu_baseline.sbatch"))
    assert out.returncode == 0 and out.stderr == "", out.stderr
