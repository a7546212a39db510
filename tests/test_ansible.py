"""The cluster playbook (ansible/): lint, and a real apply to this machine, twice.

The apply runs inside private PID, network and mount namespaces the test makes: the only
network is loopback (so every service the playbook starts listens on 127.0.0.1 and on fixed
ports no other test uses), the firewall's nftables table is the namespace's own, the share's
bind mount is seen by nobody else, and every daemon dies with the namespace's first process.
Every file the roles would write under /etc, /var and /run goes under a temporary folder
(inventories/test-local). What it checks: the services answer (the nodes are idle, a job
runs, the share is bound, the hub answers), the firewall's rules are loaded, and a second
apply changes nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_conf import NODES, hardware_layout, slurm_values

from guide_utils.cluster import provision

REPO = Path(__file__).resolve().parents[1]
ANSIBLE = REPO / "ansible"
BIN = REPO / ".venv" / "bin"
INVENTORIES = sorted(p.parent.name for p in (ANSIBLE / "inventories").glob("*/hosts.yml"))


def _tool(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run scripts/setup.sh (requirements.txt pins ansible-core and ansible-lint)")
    return path


# --- fast: the playbook parses and lints ---------------------------------------------------

def test_every_inventory_passes_the_syntax_check():
    for inventory in INVENTORIES:
        out = subprocess.run([str(_tool("ansible-playbook")), "--syntax-check", "-i",
                              f"inventories/{inventory}/hosts.yml", "site.yml"],
                             cwd=ANSIBLE, capture_output=True, text=True,
                             env={**os.environ, "GUIDE_TEST_ROOT": "/nonexistent"})
        assert out.returncode == 0, f"{inventory}: {out.stdout}{out.stderr}"
    assert {"one-node", "head-gpu-nodes", "slices-testbed", "test-local"} <= set(INVENTORIES)


def test_ansible_lint_production_profile_passes():
    home = Path(os.environ.get("TMPDIR", "/tmp")) / "ansible-lint"
    out = subprocess.run([str(_tool("ansible-lint")), "--nocolor"], cwd=ANSIBLE, capture_output=True, text=True,
                         env={**os.environ, "ANSIBLE_HOME": str(home)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Passed" in out.stdout + out.stderr, out.stdout + out.stderr


def test_the_role_defaults_define_every_variable_the_slurm_templates_read():
    import yaml

    defaults = yaml.safe_load((ANSIBLE / "roles/slurm/defaults/main.yml").read_text())
    used = provision.template_variables()
    assert used - set(defaults) == set()
    values = slurm_values(root=Path("/r"), host="h", ctld_port=1, node_ports=[2, 3], layout="CPUs=2",
                         socket=Path("/r/m.sock"), first_job_id=7)
    assert used - set(values) == set(), "tests/slurm_conf.py gives the tests' Slurm every variable"
    conf = provision.render("slurm.conf", values)
    assert "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny" in conf
    assert "NodeName=guide-n2 NodeHostname=h NodeAddr=127.0.0.1 Port=3 CPUs=2 RealMemory=4000 Gres=gpu:4" in conf
    assert "File=/r/dev-guide-n1/nvidia[0-3]" in provision.render("gres.conf", values)



def test_apt_updates_its_cache_only_where_the_inventory_asks():
    """Ansible's apt module updates a cache older than any non-zero cache_valid_time even with
    update_cache false: the tests' sandbox has no network, so the first apply after a day
    without an `apt-get update` here failed (CI of 2026-11-29). With common_apt_update false the
    task asks for no update at all; with true, for one a day."""
    import yaml

    [task] = [t for t in yaml.safe_load((ANSIBLE / "roles/common/tasks/main.yml").read_text())
              if "ansible.builtin.apt" in t]
    args = task["ansible.builtin.apt"]
    defaults = yaml.safe_load((ANSIBLE / "roles/common/defaults/main.yml").read_text())
    test_vars = yaml.safe_load((ANSIBLE / "inventories/test-local/group_vars/cluster.yml").read_text())

    def rendered(**values):
        # Ansible's own bool filter, in a process of its own: importing Ansible patches
        # sys.intern, which torch._dynamo (imported later by this worker's tests) refuses.
        code = ("import json, sys, jinja2; from ansible.plugins.filter.core import to_bool; "
                "args, values = json.load(sys.stdin); env = jinja2.Environment(); env.filters['bool'] = to_bool; "
                "print(json.dumps({k: env.from_string(str(v)).render(**values) for k, v in args.items()}))")
        keys = ("update_cache", "cache_valid_time")
        out = subprocess.run([sys.executable, "-c", code], input=json.dumps([{k: args[k] for k in keys}, values]),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    assert rendered(**{**defaults, **test_vars}) == {"update_cache": "False", "cache_valid_time": "0"}
    assert rendered(**defaults) == {"update_cache": "True", "cache_valid_time": "86400"}
    # `-e common_apt_update=false` on the command line arrives as a string, true to Jinja
    assert rendered(**{**defaults, "common_apt_update": "false"})["cache_valid_time"] == "0"

# --- slow: the playbook applied to this machine -----------------------------------------

CTLD_PORT, NODE_PORTS, HUB_PORT = 6817, [6818, 6819], 8000


def _cannot_apply() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the playbook installs packages and starts daemons"
    missing = [t for t in ("unshare", "nsenter", "start-stop-daemon", "nft", "slurmctld", "slurmd", "munged")
               if not shutil.which(t)]
    if missing:
        return f"missing: {', '.join(missing)} (scripts/setup.sh installs them)"
    return None


# glibc's getaddrinfo with AI_ADDRCONFIG (Slurm's daemons use it) finds no address at all
# where the only interface is loopback, even for 127.0.0.1: the sandbox gets a pair of
# virtual interfaces joined to each other only, with an address nobody else sees.
VETH = ("ip link add guide0 type veth peer name guide1 && ip addr add 10.255.255.1/32 dev guide0 "
        "&& ip link set guide0 up && ip link set guide1 up")


class Sandbox:
    """Private PID, network and mount namespaces held by one process; every daemon started in
    them dies with it."""

    def __init__(self, root: Path):
        self.root = root
        hosts = root / "hosts"
        names = " ".join([*NODES, socket.gethostname(), socket.gethostname().split(".")[0], "localhost"])
        hosts.write_text(f"127.0.0.1 {names}\n")
        ready = root / "sandbox-ready"
        self.holder = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", "--net", "--mount", "--propagation", "private", "--",
             "sh", "-c",
             f'ip link set lo up && {VETH} && mount --bind "$1" /etc/hosts && : >"$2" && exec sleep infinity',
             "sh", str(hosts), str(ready)], start_new_session=True)
        deadline = time.monotonic() + 20
        while not ready.exists():
            if self.holder.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the sandbox did not start (exit {self.holder.poll()})")
            time.sleep(0.1)
        # unshare --fork: the namespaces' first process is the holder's child
        self.pid = int(subprocess.run(["pgrep", "-P", str(self.holder.pid)], capture_output=True, text=True,
                                      check=True).stdout.split()[0])

    def run(self, *cmd: str, cwd: Path = REPO, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        # --wd: entering a mount namespace otherwise puts the command in the holder's folder
        return subprocess.run(["nsenter", f"--target={self.pid}", "--pid", "--net", "--mount", f"--wd={cwd}", "--",
                               *cmd], capture_output=True, text=True, timeout=timeout, **kw)

    def close(self) -> None:
        os.killpg(self.holder.pid, signal.SIGKILL)
        self.holder.wait()


def _recap(out: str) -> dict[str, int]:
    """The PLAY RECAP counts of the one host."""
    line = next(line for line in out.splitlines() if line.startswith("localhost") and "ok=" in line)
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def _changed_tasks(out: str) -> list[str]:
    """The tasks whose result was "changed", with their names, from the default callback."""
    task, changed = "", []
    for line in out.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line.split("[", 1)[1].rsplit("]", 1)[0]
        elif line.startswith("changed:"):
            changed.append(f"{task}: {line}")
    return changed


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    """The playbook applied twice; the sandbox, the two runs' output and the extra variables."""
    reason = _cannot_apply()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("ansible")
    root.chmod(0o755)
    box = Sandbox(root)
    try:
        host = socket.gethostname().split(".")[0]
        values = slurm_values(root=root / "slurm", host=host, ctld_port=CTLD_PORT, node_ports=NODE_PORTS,
                              layout=hardware_layout(), socket=root / "run/munge/munge.socket.2", first_job_id=1)
        extra = {k: values[k] for k in ("slurm_nodes", "slurm_partitions", "slurm_auth_info", "slurm_task_plugin",
                                        "slurm_communication_parameters", "slurm_gres_autodetect")}
        extra.update(slurm_ctld_port=CTLD_PORT, jupyterhub_port=HUB_PORT)
        for node in extra["slurm_nodes"]:  # the fake GPUs' device files, as the tests' Slurm makes them
            d = Path(node["gpu_files"]).parent
            d.mkdir(parents=True, exist_ok=True)
            for i in range(node["gpus"]):
                if not (d / f"nvidia{i}").exists():
                    os.mknod(d / f"nvidia{i}", 0o600 | 0o020000, os.makedev(195, i))
        (root / "vars.json").write_text(json.dumps(extra))
        env = {**os.environ, "GUIDE_TEST_ROOT": str(root), "ANSIBLE_HOME": str(root / "ansible-home"),
               "ANSIBLE_LOCAL_TEMP": str(root / "ansible-tmp"), "ANSIBLE_NOCOLOR": "1",
               "PATH": f"{BIN}:{os.environ['PATH']}"}
        runs = []
        for _ in range(2):
            started = time.monotonic()
            out = box.run(str(_tool("ansible-playbook")), "-i", "inventories/test-local/hosts.yml", "site.yml",
                          "-e", f"@{root / 'vars.json'}", timeout=600, cwd=ANSIBLE, env=env)
            (root / f"apply-{len(runs) + 1}.log").write_text(out.stdout + out.stderr)
            assert out.returncode == 0, f"apply {len(runs) + 1} failed:\n{(out.stdout + out.stderr)[-6000:]}"
            runs.append(out.stdout)
            print(f"apply {len(runs)}: {time.monotonic() - started:.0f} s, {_recap(out.stdout)}")
        yield box, runs, root
    finally:
        box.close()


@pytest.mark.slow
@pytest.mark.slurm
def test_the_second_apply_changes_nothing(applied):
    _, (first, second), _ = applied
    assert _recap(first)["changed"] > 0  # the first one did something: the check below can fail
    assert _recap(second)["failed"] == 0
    assert _recap(second)["changed"] == 0, "changed on the second apply:\n" + "\n".join(_changed_tasks(second))


@pytest.mark.slow
@pytest.mark.slurm
def test_the_cluster_it_built_runs_a_job(applied):
    box, _, root = applied
    env = {**os.environ, "SLURM_CONF": str(root / "etc/slurm/slurm.conf")}
    deadline = time.monotonic() + 60
    while True:
        states = box.run("sinfo", "-h", "-N", "-o", "%N %t", env=env).stdout.split("\n")
        if sorted(s.strip() for s in states if s.strip()) == [f"{n} idle" for n in NODES]:
            break
        assert time.monotonic() < deadline, f"nodes not idle: {states}"
        time.sleep(1)
    out = box.run("sbatch", "--wait", "-N2", "-o", str(root / "share/results/job-%j.out"), "--wrap",
                  "srun hostname -s; srun printenv SLURMD_NODENAME", env=env, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    job = re.search(r"Submitted batch job (\d+)", out.stdout).group(1)
    # the job wrote into the share; the share is the exported folder, bound
    text = (root / "srv/guide-share/results" / f"job-{job}.out").read_text()
    assert sorted(text.split()[-2:]) == list(NODES), text


@pytest.mark.slow
@pytest.mark.slurm
def test_the_hub_answers_and_the_firewall_is_loaded(applied):
    box, _, root = applied
    api = box.run("python3", "-c", f"import urllib.request;print(urllib.request.urlopen("
                  f"'http://127.0.0.1:{HUB_PORT}/hub/api', timeout=10).read().decode())")
    assert api.returncode == 0, api.stderr
    assert json.loads(api.stdout)["version"] == "6.1.1"
    rules = box.run("nft", "list", "table", "inet", "guide")
    assert rules.returncode == 0, rules.stderr
    assert "policy drop" in rules.stdout and f"dport {CTLD_PORT}" in rules.stdout.replace("{ ", ""), rules.stdout
    # the host's own tables are untouched: the sandbox has its own
    assert subprocess.run(["nft", "list", "table", "inet", "guide"], capture_output=True).returncode != 0
    # every service on loopback only: none on the sandbox's other address, none on every address
    listening = box.run("ss", "-Hltn").stdout.split("\n")
    addrs = {line.split()[3].rsplit(":", 1)[0] for line in listening if line.strip()}
    assert addrs == {"127.0.0.1"}, addrs
