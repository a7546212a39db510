"""The site profiles as a centre would check them: the three worked examples (sites/puhti-like.sh,
lumi-like.sh, perlmutter-like.sh) drive every sbatch example through ``submit.sh --dry-run`` on a
login node, where the job's variables ($LOCAL_SCRATCH, $PSCRATCH, $SLURM_*) do not exist yet, and
the printed sbatch line speaks each site's own syntax; and every profile in sites/ sets what
lib/guide.sh requires, with its lists as arrays."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "slurm_examples"
SITES = EXAMPLES / "sites"
SCRIPTS = sorted(EXAMPLES.glob("[0-9][0-9]_*.sbatch"))
PROFILES = sorted(SITES.glob("*.sh"))
# Set only inside a job (or only at one centre): a dry run on a login node goes without them.
JOB_ONLY = ("LOCAL_SCRATCH", "TMPDIR", "PSCRATCH", "SCRATCH")


def login_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "GUIDE_")) and k not in JOB_ONLY}
    return {**env, "GUIDE_ROOT": str(REPO), **extra}


@dataclass(frozen=True)
class Expected:
    gpus_per_node: int
    everywhere: tuple[str, ...]  # options every sbatch line of the site has
    gpu_format: str              # the GPU option for N tasks per node ({n}), or a per-task one
    absent: tuple[str, ...]      # option prefixes that are not this site's syntax
    shared: tuple[str, ...] = ()  # a job smaller than a node: these instead of `everywhere` (none: the same)

    def gpu(self, tasks: int) -> str:
        return self.gpu_format.format(n=tasks)


EXPECTED = {
    "puhti-like": Expected(4, ("--account=project_2001234", "--partition=gpu", "--cpus-per-task=10",
                               "--mem-per-cpu=9G"),
                           "--gres=gpu:v100:{n},nvme:200", ("--gpus",)),
    "lumi-like": Expected(8, ("--account=project_465000000", "--partition=standard-g", "--cpus-per-task=7",
                              "--mem=480G"),
                          "--gpus-per-node={n}", ("--gres", "--gpus-per-task", "--gpus="),
                          ("--account=project_465000000", "--partition=small-g", "--cpus-per-task=7",
                           "--mem-per-gpu=60G")),
    "perlmutter-like": Expected(4, ("--account=m0000_g", "--cpus-per-task=32", "--constraint=gpu", "--qos=regular"),
                                "--gpus-per-task=1", ("--partition", "--gres", "--gpus-per-node", "--gpus="),
                                ("--account=m0000_g", "--cpus-per-task=32", "--constraint=gpu", "--qos=shared")),
}


def dry_run(site: str, script: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXAMPLES / "submit.sh"), "--dry-run", str(script), *args],
                          env=login_env(GUIDE_SITE=site), capture_output=True, text=True, cwd=REPO)


def sbatch_options(site: str, script: Path, *args: str) -> list[str]:
    out = dry_run(site, script, *args)
    assert out.returncode == 0, f"{site} {script.name} {args}: {out.stderr}"
    argv = shlex.split(out.stdout)
    assert argv[0] == "sbatch" and str(script) in argv, argv
    return argv[1:argv.index(str(script))]


def layout(opts: list[str], script: Path) -> tuple[int, int]:
    """(nodes, tasks per node) of the job: the command's option, else the script's #SBATCH."""
    def value(name: str) -> int:
        given = [o.split("=", 1)[1] for o in opts if o.startswith(f"--{name}=")]
        own = re.findall(rf"^#SBATCH --{name}=(\d+)", script.read_text(), re.M)
        return int((given or own)[-1])
    return value("nodes"), value("ntasks-per-node")


def gpu_options(opts: list[str]) -> list[str]:
    return [o for o in opts if o.startswith(("--gres", "--gpus"))]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
@pytest.mark.parametrize("site", sorted(EXPECTED))
def test_every_example_submits_in_the_sites_own_syntax(site, script):
    """Every example, as submitted with the profile alone: the site's account, partition (or
    constraint and QOS), CPUs per task and memory, and one GPU request in its syntax for the
    tasks the job places on a node (the script's own count, else the site's GPUs per node)."""
    expected = EXPECTED[site]
    opts = sbatch_options(site, script)
    nodes, tasks = layout(opts, script)
    # A job of fewer GPUs than one node is billed for what it uses where the site offers that.
    shared = nodes == 1 and tasks < expected.gpus_per_node and expected.shared
    wanted = expected.shared if shared else expected.everywhere
    missing = [o for o in wanted if o not in opts]
    assert not missing, (missing, opts)
    assert not shared or not {*expected.everywhere} - {*expected.shared} & {*opts}, opts
    own = re.findall(r"^#SBATCH --ntasks-per-node=(\d+)", script.read_text(), re.M)
    assert tasks == int((own or [expected.gpus_per_node])[0]) and nodes >= 1
    assert gpu_options(opts) == [expected.gpu(tasks)], opts
    foreign = [o for o in opts if o.startswith(expected.absent)]
    assert not foreign, f"not {site}'s syntax: {foreign}"
    assert "--export=ALL" in opts and any(o.startswith("--output=") for o in opts)


@pytest.mark.parametrize("site, workers, nodes, tasks", [
    ("puhti-like", 1, 1, 1), ("puhti-like", 4, 1, 4), ("puhti-like", 8, 2, 4), ("puhti-like", 6, 2, 3),
    ("puhti-like", 32, 8, 4),
    ("lumi-like", 8, 1, 8), ("lumi-like", 16, 2, 8), ("lumi-like", 12, 2, 6), ("lumi-like", 32, 4, 8),
    ("perlmutter-like", 4, 1, 4), ("perlmutter-like", 8, 2, 4), ("perlmutter-like", 6, 2, 3),
    ("perlmutter-like", 32, 8, 4),
])
def test_workers_become_the_sites_nodes_and_tasks(site, workers, nodes, tasks):
    """--workers=N: as few nodes as hold N at the site's GPUs per node, the same number on
    each, and the GPU request follows the tasks per node (or stays one per task)."""
    script = EXAMPLES / "03_multi_node_horovod.sbatch"
    opts = sbatch_options(site, script, f"--workers={workers}")
    assert layout(opts, script) == (nodes, tasks), opts
    assert gpu_options(opts) == [EXPECTED[site].gpu(tasks)], opts


def test_a_per_task_gpu_request_carries_no_count_per_node():
    """Perlmutter-style: --gpus-per-task=1 on 1, 3 and 4 tasks per node alike, never a
    per-node count (which would ask for GPUs the tasks do not use, or too few)."""
    for workers in (1, 3, 4, 8):
        opts = sbatch_options("perlmutter-like", EXAMPLES / "03_multi_node_horovod.sbatch", f"--workers={workers}")
        assert gpu_options(opts) == ["--gpus-per-task=1"], opts
    opts = sbatch_options("perlmutter-like", EXAMPLES / "01_single_gpu_baseline.sbatch")
    assert gpu_options(opts) == ["--gpus-per-task=1"] and "--ntasks-per-node=1" not in opts  # the script's own


@pytest.mark.parametrize("site, workers, hint", [
    ("lumi-like", 9, "use --workers=8 or --workers=10"),
    ("puhti-like", 7, "use --workers=6 or --workers=8"),
])
def test_a_count_a_site_cannot_spread_is_one_line(site, workers, hint):
    out = dry_run(site, EXAMPLES / "03_multi_node_horovod.sbatch", f"--workers={workers}")
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"error: --workers={workers} cannot be spread evenly") and line.endswith(hint), line


# -- What a profile is made of ----------------------------------------------------------------

def _guide_sh() -> str:
    return (EXAMPLES / "lib" / "guide.sh").read_text()


def required_names() -> list[str]:
    block = re.search(r"^GUIDE_REQUIRED=\(([^)]*)\)", _guide_sh(), re.M)
    assert block, "lib/guide.sh defines GUIDE_REQUIRED=(...)"
    return block.group(1).split()


def array_names() -> set[str]:
    """The variables guide.sh insists are arrays (its check loop), and those the template
    documents as arrays."""
    loop = re.search(r"for name in ((?:GUIDE_\w+\s*)+); do\s*\n[^\n]*declare -a", _guide_sh())
    assert loop, "lib/guide.sh checks its array variables in a loop"
    documented = re.findall(r"^(GUIDE_\w+)=\(", (SITES / "TEMPLATE.sh").read_text(), re.M)
    return set(loop.group(1).split()) | set(documented)


def assigned_names(path: Path) -> set[str]:
    return set(re.findall(r"^\s*(?:export\s+)?(GUIDE_\w+)=", path.read_text(), re.M))


def test_the_profile_conventions_are_read_right():
    assert {"GUIDE_ACCOUNT", "GUIDE_GPU_REQUEST", "GUIDE_SCRATCH", "GUIDE_SRUN_MPI"} <= set(required_names())
    assert {"GUIDE_TRAIN_ARGS", "GUIDE_SBATCH_EXTRA", "GUIDE_APPTAINER_FLAGS", "GUIDE_SRUN_ARGS"} <= array_names()
    assert {p.stem for p in PROFILES} >= {"TEMPLATE", "ci", "thesis-taito", *EXPECTED}


def _probe(path: Path, required: list[str], arrays: set[str]) -> list[str]:
    """Source ``path`` as submit.sh does on a login node; one line per problem."""
    script = (r'set +u; source "$1"; shift; req=(); arr=(); for a; do case $a in req:*) req+=("${a#req:}");; '
              r'arr:*) arr+=("${a#arr:}");; esac; done; '
              r'for n in "${req[@]}"; do [[ -n ${!n+set} ]] || echo "does not set $n"; done; '
              r'for n in "${arr[@]}"; do [[ -z ${!n+set} || $(declare -p "$n") == "declare -a"* ]] || '
              r'echo "$n is not an array"; done')
    out = subprocess.run(["bash", "-c", script, "probe", str(path), *(f"req:{n}" for n in required),
                          *(f"arr:{n}" for n in sorted(arrays))], env=login_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_every_profile_sets_what_guide_sh_requires_and_lists_are_arrays(path):
    assert _probe(path, required_names(), array_names()) == []


def test_the_probe_finds_a_missing_value_and_a_list_as_a_string(tmp_path):
    broken = tmp_path / "broken.sh"
    text = (SITES / "ci.sh").read_text()
    broken.write_text(re.sub(r"^GUIDE_SCRATCH=.*\n", "", text, flags=re.M) + 'GUIDE_SRUN_ARGS="--cpu-bind=cores"\n')
    assert _probe(broken, required_names(), array_names()) == ["does not set GUIDE_SCRATCH",
                                                               "GUIDE_SRUN_ARGS is not an array"]


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_every_name_a_profile_sets_is_documented_in_the_template(path):
    """A misspelt name (GUIDE_SRUN_ARG) would be silently ignored: every GUIDE_* a profile
    assigns is one TEMPLATE.sh documents."""
    unknown = assigned_names(path) - assigned_names(SITES / "TEMPLATE.sh")
    assert not unknown, f"{path.name} sets {sorted(unknown)}, which TEMPLATE.sh does not document"


def profile_values(site: str, *names: str) -> dict[str, list[str]]:
    """The values of ``names`` after sourcing the profile on a login node (each a list: an
    array's elements, or a scalar as one element)."""
    script = (r'set +u; source "$1"; shift; for n; do declare -n ref=$n; printf "%s\0" "$n"; '
              r'for x in "${ref[@]}"; do printf "\1%s\0" "$x"; done; unset -n ref; done')
    out = subprocess.run(["bash", "-c", script, "values", str(SITES / f"{site}.sh"), *names], env=login_env(),
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    values: dict[str, list[str]] = {}
    for item in out.stdout.split("\0")[:-1]:
        if item.startswith("\1"):
            values[name].append(item[1:])
        else:
            name = item
            values[name] = []
    return values


@pytest.mark.parametrize("site", sorted(EXPECTED))
def test_the_worked_profiles_say_what_they_are_and_cite_their_sources(site):
    text = (SITES / f"{site}.sh").read_text()
    head = "\n".join(line for line in text.splitlines()[:3])
    assert "Illustrative; check your centre's user guide." in head
    assert len(re.findall(r"^#\s+https://", text, re.M)) >= 3, "cite the user-guide pages the values come from"
    assert "placeholder" in text
    values = profile_values(site, "GUIDE_TRAIN_PROFILE", "GUIDE_DATASET_ARCHIVE")
    assert values["GUIDE_TRAIN_PROFILE"] == ["full"] and values["GUIDE_DATASET_ARCHIVE"][0].endswith(".tar")


def test_one_worked_profile_is_modules_only():
    """PyTorch from the site's module, no venv: guide.sh adds the repository's src/ itself."""
    only = [site for site in EXPECTED
            if profile_values(site, "GUIDE_SOFTWARE", "GUIDE_VENV") == {"GUIDE_SOFTWARE": ["modules"],
                                                                        "GUIDE_VENV": [""]}]
    assert only == ["puhti-like"]


@pytest.mark.parametrize("site, cpus_on_node", [("puhti-like", 40), ("lumi-like", 56), ("perlmutter-like", 128)])
def test_cpus_per_task_fill_the_node_in_slurms_unit(site, cpus_on_node):
    """Puhti: 40 cores; LUMI-G: 56 of 64 cores usable; Perlmutter: 128 hardware threads, which
    its Slurm counts as CPUs."""
    v = profile_values(site, "GUIDE_CPUS_PER_TASK", "GUIDE_TASKS_PER_NODE")
    assert int(v["GUIDE_CPUS_PER_TASK"][0]) * int(v["GUIDE_TASKS_PER_NODE"][0]) == cpus_on_node


def test_lumi_binding_masks_give_each_gcd_its_own_usable_cores():
    """One mask per task, in GCD order, each GUIDE_CPUS_PER_TASK cores of one 8-core L3 group
    without its first core (reserved on LUMI-G), no core twice, and the group next to the
    GCD: GCDs 0-7 sit on NUMA nodes 3,3,1,1,0,0,2,2 (16 cores each)."""
    v = profile_values("lumi-like", "GUIDE_SRUN_ARGS", "GUIDE_CPUS_PER_TASK", "GUIDE_TASKS_PER_NODE")
    (bind,) = [a for a in v["GUIDE_SRUN_ARGS"] if a.startswith("--cpu-bind=")]
    masks = [int(m, 16) for m in bind.removeprefix("--cpu-bind=mask_cpu:").split(",")]
    assert len(masks) == int(v["GUIDE_TASKS_PER_NODE"][0])
    seen = 0
    for gcd, (mask, numa) in enumerate(zip(masks, [3, 3, 1, 1, 0, 0, 2, 2])):
        cores = [c for c in range(64) if mask >> c & 1]
        assert mask < 1 << 64 and len(cores) == int(v["GUIDE_CPUS_PER_TASK"][0]), (gcd, hex(mask))
        assert all(c % 8 for c in cores), f"GCD {gcd} mask {mask:#x} takes a reserved core"
        assert len({c // 8 for c in cores}) == 1 and {c // 16 for c in cores} == {numa}, (gcd, cores)
        assert not seen & mask
        seen |= mask


@pytest.mark.parametrize("site", ["lumi-like", "perlmutter-like"])
def test_cray_sites_start_mpi_with_srun_only(site):
    text = (SITES / f"{site}.sh").read_text()
    assert profile_values(site, "GUIDE_SRUN_MPI")["GUIDE_SRUN_MPI"] == ["cray_shasta"]
    assert "no mpirun" in text and "LAUNCHER=mpirun" in text
    exported = profile_values(site, "NCCL_SOCKET_IFNAME", "NCCL_NET_GDR_LEVEL", "FI_MR_CACHE_MONITOR")
    assert exported == {"NCCL_SOCKET_IFNAME": ["hsn0,hsn1,hsn2,hsn3"], "NCCL_NET_GDR_LEVEL": ["PHB"],
                        "FI_MR_CACHE_MONITOR": ["userfaultfd"]}
    assert profile_values(site, "GUIDE_MODULE_PURGE")["GUIDE_MODULE_PURGE"] == ["no"]


def test_the_books_dry_runs_of_the_three_profiles_are_what_submit_sh_prints():
    """book/slurm.md ("Three site profiles") shows each profile's sbatch line for 03; each shown
    line, up to its closing "...", is the start of what submit.sh prints today."""
    text = (REPO / "book" / "slurm.md").read_text()
    section = text.split("## Three site profiles", 1)[1].split("\n## ", 1)[0]
    shown = re.findall(r"^\$ GUIDE_SITE=(\S+) slurm_examples/submit\.sh --dry-run (\S+) (.*)\n(sbatch .*) \.\.\.$",
                       section, re.M)
    assert {site for site, *_ in shown} == set(EXPECTED), shown
    for site, script, args, line in shown:
        out = dry_run(site, REPO / script, *shlex.split(args))
        assert out.returncode == 0, out.stderr
        printed = out.stdout.replace(f" {REPO / script}", f" {script}")
        assert printed.startswith(line + " "), (line, printed)


@pytest.mark.parametrize("site", EXPECTED)
def test_a_stalled_horovod_job_ends_instead_of_idling(site):
    """Each worked profile sets Horovod's stall shutdown, which acts only when it is longer
    than the stall warning (horovodrun --help); its default, 0, never ends the job."""
    values = profile_values(site, "HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
    (check,), (shutdown,) = values["HOROVOD_STALL_CHECK_TIME_SECONDS"], values["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"]
    assert 0 < int(check) < int(shutdown), values


# -- The profile of a cluster the guide's playbook built (ansible/, book chapter 18) ---------

def _ansible_value(path: str, name: str, **context):
    """A variable of the playbook's YAML, its Jinja2 rendered with ``context`` (plain
    variables only, as the playbook's defaults use)."""
    import jinja2
    import yaml

    value = yaml.safe_load((REPO / "ansible" / path).read_text())[name]
    return jinja2.Template(value).render(**context) if isinstance(value, str) else value


def test_the_byoc_profile_matches_what_the_playbook_installs():
    """Partition, venv, srun's MPI plugin, GPUs per node and the network: the values of the
    playbook's defaults and of the slices-testbed inventory, so a change there fails here."""
    import yaml

    share = _ansible_value("group_vars/all.yml", "guide_share")
    root = _ansible_value("group_vars/all.yml", "guide_root", guide_share=share)
    testbed = yaml.safe_load((REPO / "ansible/inventories/slices-testbed/group_vars/cluster.yml").read_text())
    hosts = yaml.safe_load((REPO / "ansible/inventories/slices-testbed/hosts.yml").read_text())
    compute = hosts["all"]["children"]["cluster"]["children"]["slurm_compute"]["vars"]
    v = profile_values("byoc", "GUIDE_PARTITION", "GUIDE_VENV", "GUIDE_SRUN_MPI", "GUIDE_TASKS_PER_NODE",
                       "GUIDE_GPU_REQUEST", "GUIDE_SCRATCH", "GUIDE_SOFTWARE", "GUIDE_NETWORK")
    assert v["GUIDE_PARTITION"] == [_ansible_value("roles/slurm/defaults/main.yml", "slurm_partition_name")]
    assert v["GUIDE_PARTITION"] == [testbed["slurm_partition_name"]]
    assert v["GUIDE_VENV"] == [_ansible_value("group_vars/all.yml", "guide_venv", guide_root=root)]
    assert v["GUIDE_SRUN_MPI"] == [_ansible_value("roles/slurm/defaults/main.yml", "slurm_mpi_default")]
    assert v["GUIDE_TASKS_PER_NODE"] == [str(compute["gpus"])]
    assert v["GUIDE_NETWORK"] == [f"{testbed['guide_network_gbit']}Gbit/s"]
    assert v["GUIDE_SCRATCH"] == [""] and v["GUIDE_SOFTWARE"] == ["venv"]  # the node's disk, not the share
    assert v["GUIDE_GPU_REQUEST"] == ["--gpus-per-node=%d"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_example_submits_at_a_playbook_built_site(script):
    opts = sbatch_options("byoc", script)
    nodes, tasks = layout(opts, script)
    own = re.findall(r"^#SBATCH --ntasks-per-node=(\d+)", script.read_text(), re.M)
    assert tasks == int((own or [1])[0]) and nodes >= 1
    assert "--partition=gpu" in opts and gpu_options(opts) == [f"--gpus-per-node={tasks}"], opts
    assert not any(o.startswith("--account") for o in opts)


def _in_guide(site: str, script: str, **env: str) -> list[str]:
    """The lines ``script`` prints after sourcing lib/guide.sh with ``site`` on a login node."""
    out = subprocess.run(["bash", "-c", f'source "{EXAMPLES}/lib/guide.sh"\nset -euo pipefail\n{script}'],
                         env=login_env(GUIDE_SITE=site, USER="me", **env), capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.mark.parametrize("site, dist", [
    ("puhti-like", "ddp"), ("lumi-like", "ddp"), ("perlmutter-like", "ddp"),  # no Horovod in their modules
    ("apptainer-example", "ddp"), ("gpus-per-node-apptainer", "ddp"),  # the image's Horovod has no NCCL
    ("byoc", "ddp"),  # scripts/setup.sh's Horovod (the playbook's, as `make`'s) has no NCCL
    ("thesis-taito", "horovod"), ("ci", "horovod"),
])
def test_dist_defaults_to_what_the_site_has(site, dist):
    """A script's Horovod default becomes DDP unless the profile says the software has a
    Horovod with NCCL for its GPUs (GUIDE_HOROVOD=yes): no job that queues, then dies at the
    doctor. DIST given by the user, and a script's own DDP default, stay as they are."""
    script = 'guide_dist horovod; DIST=horovod guide_dist horovod; guide_dist ddp'
    assert _in_guide(site, script) == [dist, "horovod", "ddp"]


def test_a_profile_copied_from_the_template_trains_with_ddp_unless_it_says_horovod_has_nccl(tmp_path):
    """The TEMPLATE as a newcomer fills it in, pointing at the `make`-built venv (whose Horovod
    has no NCCL): the scripts' Horovod default is DDP; GUIDE_HOROVOD=yes, or no line at all
    (a profile from an older TEMPLATE), keeps to what the profile says."""
    text = (SITES / "TEMPLATE.sh").read_text().replace('GUIDE_VENV=""', "GUIDE_VENV=/home/me/guide/.venv", 1)
    for name, lines in (("copy", text), ("yes", text.replace("GUIDE_HOROVOD=no ", "GUIDE_HOROVOD=yes", 1)),
                        ("unset", re.sub(r"^GUIDE_HOROVOD=.*$", "", text, flags=re.M))):
        (tmp_path / f"{name}.sh").write_text(lines)
    script = "guide_dist horovod"
    assert [_in_guide(str(tmp_path / f"{n}.sh"), script) for n in ("copy", "yes", "unset")] == [
        ["ddp"], ["horovod"], ["ddp"]]


@pytest.mark.parametrize("site, output", [
    ("lumi-like", "/scratch/project_465000000/me/guide"), ("perlmutter-like", "/pscratch/me/guide"),
    ("puhti-like", "/scratch/project_2001234/me/guide"), ("ci", str(REPO)),
])
def test_results_and_checkpoints_default_to_the_sites_scratch(site, output):
    """Run records and checkpoints go to the profile's GUIDE_OUTPUT (a project's scratch), not
    into the repository (often in $HOME, with a small quota); the test variables still win."""
    script = 'guide_load_site; guide_results_dir; guide_checkpoint_root'
    assert _in_guide(site, script, PSCRATCH="/pscratch/me") == [f"{output}/results", f"{output}/checkpoints"]
    assert _in_guide(site, script, GUIDE_RESULTS_DIR="/r", GUIDE_CHECKPOINT_ROOT="/c") == ["/r", "/c"]


def test_one_torchrun_per_node_keeps_the_sites_cpu_masks():
    """LUMI binds each task to the cores next to its GCD by a mask. One torchrun per node is
    one task for all eight processes: it gets the union of the eight masks (every core but
    the first of each L3 group, which LUMI keeps for the system), not an unbound node; a
    job smaller than a node (small-g) has no masks at all, and a site without masks none."""
    def job(n: int, nodes: int) -> str:
        return (f"export SLURM_JOB_ID=5 SLURM_NTASKS={n} SLURM_JOB_NUM_NODES={nodes} SLURM_CPUS_PER_TASK=7; "
                "guide_load_site; GUIDE_EXEC=() GUIDE_DIST=ddp GUIDE_LAUNCH=node; guide_task_options; "
                'printf "%s\\n" "${GUIDE_SRUN_NODES[@]}"')
    whole = _in_guide("lumi-like", job(16, 2))
    assert "--cpu-bind=mask_cpu:0xfefefefefefefefe" in whole and "--cpus-per-task=56" in whole, whole
    shared = _in_guide("lumi-like", job(1, 1))
    assert not [o for o in shared if o.startswith("--cpu-bind")], shared
    puhti = _in_guide("puhti-like", job(8, 2))
    assert not [o for o in puhti if o.startswith("--cpu-bind")], puhti


def test_the_profiles_pytorch_modules_have_what_the_examples_call():
    """The examples of chapter 16 call torch.accelerator, which came with PyTorch 2.6: every
    profile (and the TEMPLATE's example) that loads a versioned PyTorch module loads 2.6 or later."""
    found = {}
    for path in PROFILES:
        for version in re.findall(r"\bpytorch/(\d+)\.(\d+)", path.read_text()):
            found.setdefault(path.stem, []).append(tuple(map(int, version)))
    assert {"lumi-like", "puhti-like", "TEMPLATE"} <= set(found), found
    old = {site: versions for site, versions in found.items() if min(versions) < (2, 6)}
    assert not old, f"PyTorch modules older than 2.6 (no torch.accelerator): {old}"


def test_the_lumi_profile_keeps_miopens_cache_on_the_nodes_own_disk():
    """MIOpen's find database and kernel cache default to $HOME, on Lustre at LUMI, where
    MIOpen "has problems with file/record locking": the profile puts both in the node's /tmp,
    one folder per job, and the image's variable passer takes them into a container."""
    values = profile_values("lumi-like", "MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR", "GUIDE_SCRATCH")
    assert values["GUIDE_SCRATCH"] == ["/tmp"]
    job = subprocess.run(["bash", "-c", 'set +u; source "$1"; echo "$MIOPEN_USER_DB_PATH $MIOPEN_CUSTOM_CACHE_DIR"',
                          "x", str(SITES / "lumi-like.sh")], env=login_env(USER="me", SLURM_JOB_ID="42"),
                         capture_output=True, text=True)
    assert job.stdout.split() == ["/tmp/me-miopen-42", "/tmp/me-miopen-42"], job
    assert "MIOPEN_*" in (EXAMPLES / "lib/apptainer_env.sh").read_text()


@pytest.mark.parametrize("site, launch, noted", [("lumi-like", "shell", True), ("lumi-like", "tasks", False),
                                                 ("puhti-like", "shell", False)])
def test_a_launcher_in_the_batch_shell_says_the_sites_cpu_masks_do_not_reach_its_processes(site, launch, noted):
    """02 and 09 start their processes from the batch shell (horovodrun, torchrun, papermill),
    which Slurm does not bind per task: at a site whose profile binds srun's tasks by masks
    (LUMI's, each GCD's own cores) the job says so in its log and names the scripts that bind."""
    script = ("export SLURM_JOB_ID=5 SLURM_NTASKS=8 SLURM_JOB_NUM_NODES=1 SLURM_CPUS_PER_TASK=7; guide_load_site; "
              f"GUIDE_EXEC=() GUIDE_DIST=ddp GUIDE_LAUNCH={launch}; guide_task_options")
    notes = [line for line in _in_guide(site, script) if line.startswith("== note: the profile's CPU masks")]
    assert len(notes) == noted, notes
    assert not noted or "03 with --nodes=1 and LAUNCHER=srun-ddp" in notes[0]
