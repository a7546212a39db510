"""The playbook's inventories read without Ansible (guide_utils.cluster.inventory): groups and
host ranges, the Slurm files each would get (compared with what Ansible itself renders), and
a provisioner's node list turned into an inventory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from guide_utils.cluster import inventory, provision
from guide_utils.core.errors import GuideError

REPO = Path(__file__).resolve().parents[1]
INVENTORIES = ("one-node", "head-gpu-nodes", "slices-testbed")


@pytest.mark.parametrize("name, controller, compute, gpus", [
    ("one-node", ["gpu1"], ["gpu1"], 4),
    ("head-gpu-nodes", ["head"], [f"gpu0{i}" for i in range(1, 5)], 4),
    ("slices-testbed", ["head"], [f"node{i:02d}" for i in range(1, 11)], 1),
])
def test_groups_and_host_ranges(name, controller, compute, gpus):
    inv = inventory.read(name)
    assert inv.groups["slurm_controller"] == controller and inv.groups["slurm_compute"] == compute
    assert {inv.hostvars[h]["gpus"] for h in compute} == {gpus}
    assert set(inv.groups["cluster"]) == set(controller) | set(compute)


def test_the_testbed_talks_over_its_experiment_network():
    """slices-testbed: Ansible reaches each node on the control network (ansible_host), Slurm
    uses the experiment network (cluster_address), whose speed the benchmark varies."""
    conf = provision.render("slurm.conf", inventory.slurm_values(inventory.read("slices-testbed")))
    assert "ClusterName=slices\n" in conf and "SlurmctldHost=head(192.0.2.100)\n" in conf
    assert "NodeName=node10 NodeAddr=192.0.2.110 " in conf and "203.0.113." not in conf
    assert "Gres=gpu:1 State=UNKNOWN" in conf and "MpiDefault=pmix\n" in conf


@pytest.mark.parametrize("name", INVENTORIES)
def test_every_template_variable_is_given(name):
    values = inventory.slurm_values(inventory.read(name))
    assert provision.template_variables() <= set(values)
    for file in provision.SLURM_FILES:
        assert "{{" not in provision.render(file, values)


# Not slices-testbed: render-templates.yml loads the roles' defaults as vars_files, which
# outrank the inventory's group_vars, so it prints ClusterName=guide where site.yml (role
# defaults below group_vars) installs the inventory's slurm_cluster_name, slices.
@pytest.mark.parametrize("name", ["head-gpu-nodes"])
def test_the_files_are_what_ansible_renders(name, tmp_path):
    """ansible/render-templates.yml (Ansible's own templating, the same example hardware)
    prints the head's slurm.conf and gres.conf: the same text as here."""
    playbook = Path(sys.executable).parent / "ansible-playbook"
    if not playbook.exists():
        pytest.skip("ansible-core is not in the venv: run scripts/setup.sh")
    env = {**os.environ, "ANSIBLE_CALLBACK_RESULT_FORMAT": "json", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_HOME": str(tmp_path), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp")}
    out = subprocess.run([str(playbook), "-i", f"inventories/{name}/hosts.yml", "render-templates.yml",
                          "-e", f"ansible_python_interpreter={sys.executable}"], cwd=REPO / "ansible", env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    # the default callback: "ok: [head] => (item=roles/.../slurm.conf.j2) => {JSON}" per file
    shown = re.findall(r"^ok: \[head\] => \(item=([^)]+)\) => (\{.*?^\})$", out.stdout, re.M | re.S)
    by_file = {Path(item).name.removesuffix(".j2"): json.loads(body)["msg"] for item, body in shown}
    values = inventory.slurm_values(inventory.read(name))
    for file in ("slurm.conf", "gres.conf"):
        assert provision.render(file, values) == by_file[file], file


def test_a_provisioners_node_list_becomes_the_testbed_inventory():
    """The slices-testbed inventory's machines, as a provisioner's output would list them,
    give back its groups and addresses."""
    testbed = inventory.read("slices-testbed")
    nodes = {h: {k: v for k, v in testbed.hostvars[h].items() if k in ("ansible_host", "cluster_address")}
             for h in ["head", *testbed.groups["slurm_compute"]]}
    hosts = inventory.from_nodes(nodes, head="head", gpus=1, gpu_files="/dev/nvidia0")
    again = yaml.safe_load(yaml.safe_dump(hosts))
    original = yaml.safe_load((REPO / "ansible/inventories/slices-testbed/hosts.yml").read_text())
    children = again["all"]["children"]["cluster"]["children"]
    for group in ("slurm_controller", "nfs_server", "jupyterhub"):
        assert list(children[group]["hosts"]) == ["head"]
    assert [h for p in original["all"]["children"]["cluster"]["children"]["slurm_compute"]["hosts"]
            for h in inventory.expand(p)] == list(children["slurm_compute"]["hosts"])
    assert children["slurm_compute"]["vars"] == original["all"]["children"]["cluster"]["children"][
        "slurm_compute"]["vars"]
    assert again["all"]["hosts"] == {h: {k: str(v) for k, v in f.items()} for h, f in nodes.items()}


@pytest.mark.parametrize("nodes, head, message", [
    ({"a": {"ansible_host": "192.0.2.1"}}, "b", "the head 'b' is not among the machines"),
    ({"a": {"ansible_host": "192.0.2.1"}}, "a", "no compute node"),
    ({"a": {"ansible_host": "192.0.2.1"}, "n": {"ip": "192.0.2.2"}}, "a", "machine n: give ansible_host"),
])
def test_a_node_list_that_cannot_be_a_cluster_is_one_line(nodes, head, message):
    with pytest.raises(GuideError, match=message):
        inventory.from_nodes(nodes, head=head, gpus=1, gpu_files="/dev/nvidia0")


def test_an_unknown_inventory_is_one_line():
    with pytest.raises(GuideError, match="no inventory 'nope' in ansible/inventories"):
        inventory.read("nope")


def test_the_command_turns_tofu_output_into_an_inventory_ansible_reads(tmp_path):
    """`python -m guide_utils inventory` on what `tofu output -json` prints (every output, the
    guide's among them): Ansible's own inventory parser finds the groups and addresses; a
    second run refuses to overwrite the file; bad JSON is one line."""
    tofu = {"guide_nodes": {"sensitive": False, "type": ["object", {}], "value": {
        "head": {"ansible_host": "203.0.113.100", "cluster_address": "192.0.2.100"},
        "node01": {"ansible_host": "203.0.113.101", "cluster_address": "192.0.2.101"},
        "node02": {"ansible_host": "203.0.113.102", "cluster_address": "192.0.2.102"}}},
        "other_output": {"sensitive": False, "type": "string", "value": "x"}}
    (tmp_path / "tofu.json").write_text(json.dumps(tofu))
    cmd = [sys.executable, "-m", "guide_utils", "inventory", str(tmp_path / "tofu.json"), "--head", "head",
           "--gpus", "4", "--gpu-files", "/dev/nvidia[0-3]", "-o", str(tmp_path / "hosts.yml")]
    first = subprocess.run(cmd, capture_output=True, text=True)
    assert first.returncode == 0 and "3 machines" in first.stdout, first.stderr
    listed = subprocess.run([str(Path(sys.executable).parent / "ansible-inventory"), "-i",
                             str(tmp_path / "hosts.yml"), "--list"], capture_output=True, text=True,
                            env={**os.environ, "ANSIBLE_HOME": str(tmp_path)})
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert data["slurm_compute"]["hosts"] == ["node01", "node02"] and data["slurm_controller"]["hosts"] == ["head"]
    node = data["_meta"]["hostvars"]["node02"]
    assert (node["cluster_address"], node["gpus"], node["gpu_files"]) == ("192.0.2.102", 4, "/dev/nvidia[0-3]")
    before = (tmp_path / "hosts.yml").read_text()
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 2 and "exists" in again.stderr and "Traceback" not in again.stderr
    assert (tmp_path / "hosts.yml").read_text() == before
    (tmp_path / "bad.json").write_text("{")
    bad = subprocess.run([*cmd[:4], str(tmp_path / "bad.json"), *cmd[5:-2]], capture_output=True, text=True)
    assert bad.returncode == 2 and "not JSON" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
