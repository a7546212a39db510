"""The playbook's inventories read without Ansible: which hosts play which role, and the Slurm
files the playbook would write for them (book chapter 18, "Bring your own cluster").

An inventory (``ansible/inventories/NAME/hosts.yml`` and its ``group_vars/cluster.yml``)
says which machines exist and what each does; :func:`slurm_values` turns one into the
variables of the slurm role's templates, as the playbook does, so that
:func:`guide_utils.cluster.provision.render` can show the ``slurm.conf`` a cluster would get.
Two things are Ansible's alone and are given here instead: each compute node's ``slurmd -C``
(its CPU layout and memory, read on the node during a real run) and facts such as the
default address of a host without ``ansible_host``. Variables are layered as Ansible layers
them for these files: the roles' defaults, then the playbook's ``group_vars/all.yml``, then
the inventory's ``group_vars/cluster.yml``, then each host's own.

:func:`from_nodes` goes the other way: from the list of machines a provisioner made
(``tofu output -json``, a testbed's node list) to a ``hosts.yml``.

>>> inv = read("head-gpu-nodes")
>>> inv.groups["slurm_compute"], inv.hostvars["gpu03"]["gpus"]
(['gpu01', 'gpu02', 'gpu03', 'gpu04'], 4)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..core.errors import GuideError
from ..core.paths import repo_path

ROLES = ("slurm", "munge")  # whose defaults the Slurm templates read
GROUPS = ("slurm_controller", "slurm_compute", "nfs_server", "jupyterhub")
# What render-templates.yml assumes for every compute node where no `slurmd -C` ran.
EXAMPLE_HARDWARE = "CPUs=64 Boards=1 SocketsPerBoard=2 CoresPerSocket=16 ThreadsPerCore=2"
EXAMPLE_MEMORY_MB = 500_000


@dataclass(frozen=True)
class Inventory:
    name: str
    groups: dict[str, list[str]]  # group -> hosts, in the file's order
    hostvars: dict[str, dict[str, Any]]  # host -> its variables (host's own over its groups')
    cluster_vars: dict[str, Any]  # group_vars/cluster.yml


def expand(pattern: str) -> list[str]:
    """Ansible's host ranges: ``gpu[01:04]`` -> gpu01 ... gpu04 (zero padding kept).

    >>> expand("node[08:10]"), expand("head")
    (['node08', 'node09', 'node10'], ['head'])
    """
    m = re.fullmatch(r"(.*)\[(\d+):(\d+)\](.*)", pattern)
    if not m:
        return [pattern]
    first, last = m.group(2), m.group(3)
    width = len(first) if first.startswith("0") else 0
    return [f"{m.group(1)}{i:0{width}d}{m.group(4)}" for i in range(int(first), int(last) + 1)]


def read(name: str) -> Inventory:
    """``ansible/inventories/NAME``: its groups, every host's variables, the cluster's settings."""
    import yaml

    folder = repo_path("ansible", "inventories", name)
    if not (folder / "hosts.yml").is_file():
        raise GuideError(f"no inventory {name!r} in ansible/inventories (each is a folder with hosts.yml)")
    tree = yaml.safe_load((folder / "hosts.yml").read_text())["all"]
    groups: dict[str, list[str]] = {}
    hostvars: dict[str, dict[str, Any]] = {}

    def walk(node: dict, parents: list[str]) -> None:
        for group, body in (node.get("children") or {}).items():
            body = body or {}
            for pattern, own in (body.get("hosts") or {}).items():
                for host in expand(pattern):
                    for g in [*parents, group]:
                        if host not in groups.setdefault(g, []):
                            groups[g].append(host)
                    hostvars.setdefault(host, {}).update({**(body.get("vars") or {}), **(own or {})})
            walk(body, [*parents, group])

    walk(tree, [])
    for host, own in (tree.get("hosts") or {}).items():
        hostvars.setdefault(host, {}).update(own or {})
    cluster = folder / "group_vars" / "cluster.yml"
    cluster_vars = (yaml.safe_load(cluster.read_text()) or {}) if cluster.is_file() else {}
    return Inventory(name, groups, hostvars, cluster_vars)


def _resolve(values: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """Render the ``{{ }}`` in string values with the others, until nothing changes; a value
    that reads what only Ansible knows (facts, lookups) stays as it was."""
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    out = dict(values)
    for _ in range(10):
        changed = False
        for key, value in out.items():
            if isinstance(value, str) and "{{" in value:
                try:
                    new = env.from_string(value).render(**context, **out)
                except (jinja2.UndefinedError, TypeError):
                    continue
                changed |= new != value
                out[key] = new
            elif isinstance(value, list) and any(isinstance(v, str) and "{{" in v for v in value):
                try:
                    new_list = [env.from_string(v).render(**context, **out) if isinstance(v, str) else v
                                for v in value]
                except (jinja2.UndefinedError, TypeError):
                    continue
                changed |= new_list != value
                out[key] = new_list
        if not changed:
            return out
    return out


def slurm_values(inventory: Inventory, *, hardware: str = EXAMPLE_HARDWARE,
                 memory_mb: int = EXAMPLE_MEMORY_MB) -> dict[str, Any]:
    """The slurm role's template variables for ``inventory``, every compute node described by
    ``hardware`` (``slurmd -C``'s CPU fields) and ``memory_mb`` (its RealMemory less the role's
    reserve), as ``roles/slurm/tasks/nodes.yml`` builds them on a real run."""
    import yaml

    from .provision import template_variables

    values: dict[str, Any] = {}
    for role in ROLES:
        values.update(yaml.safe_load(repo_path("ansible", "roles", role, "defaults", "main.yml").read_text()))
    values.update(yaml.safe_load(repo_path("ansible", "group_vars", "all.yml").read_text()))
    values.update(inventory.cluster_vars)
    hostvars = {}
    for host, own in inventory.hostvars.items():
        address = own.get("cluster_address") or own.get("ansible_host") or inventory.cluster_vars.get(
            "cluster_address")
        if not address:
            raise GuideError(f"host {host} of inventory {inventory.name} has no ansible_host or cluster_address: "
                             "Ansible would take its default address from the host's facts")
        hostvars[host] = {**own, "inventory_hostname_short": host.split(".")[0], "cluster_address": address}
    missing = [g for g in ("slurm_controller", "slurm_compute") if not inventory.groups.get(g)]
    if missing:
        raise GuideError(f"inventory {inventory.name} has no host in {', '.join(missing)}")
    values = _resolve(values, {"groups": inventory.groups, "hostvars": hostvars})
    nodes = [{"name": hostvars[h]["inventory_hostname_short"], "hostname": "", "addr": hostvars[h]["cluster_address"],
              "port": "", "hardware": hardware, "real_memory": memory_mb, "gpus": hostvars[h].get("gpus", 0),
              "gpu_files": hostvars[h].get("gpu_files", ""), "gpu_type": hostvars[h].get("gpu_type", "")}
             for h in inventory.groups["slurm_compute"]]
    values.update(slurm_nodes=nodes, slurm_partitions=[
        {"name": values["slurm_partition_name"], "nodes": [n["name"] for n in nodes], "default": True,
         "max_time": "INFINITE", "oversubscribe": ""}])
    unresolved = sorted(k for k in template_variables() if isinstance(values.get(k), str) and "{{" in values[k])
    if unresolved:
        raise GuideError(f"cannot resolve {', '.join(unresolved)} without Ansible")
    return values


def from_nodes(nodes: dict[str, dict[str, Any]], *, head: str, gpus: int, gpu_files: str,
               gpu_type: str = "") -> dict[str, Any]:
    """A ``hosts.yml`` (as a dict: ``yaml.safe_dump`` writes it) from a provisioner's machines.

    ``nodes``: name -> ``{"ansible_host": ..., "cluster_address": ...}`` (the second only
    where the machines have a separate network between them), the shape of the output a
    Terraform/OpenTofu module gives (``tofu output -json guide_nodes``) or of a testbed's
    node list. ``head`` runs Slurm's controller, the share and the hub; every other machine
    is a compute node with ``gpus`` GPUs at ``gpu_files``.

    >>> hosts = from_nodes({"h": {"ansible_host": "192.0.2.1"}, "n1": {"ansible_host": "192.0.2.2"}},
    ...                    head="h", gpus=1, gpu_files="/dev/nvidia0")
    >>> hosts["all"]["children"]["cluster"]["children"]["slurm_compute"]["hosts"]
    {'n1': None}
    """
    if head not in nodes:
        raise GuideError(f"the head {head!r} is not among the machines: {', '.join(nodes) or 'none'}")
    compute = [n for n in nodes if n != head]
    if not compute:
        raise GuideError("no compute node: the provisioner's output has only the head")
    for name, fields in nodes.items():
        unknown = set(fields) - {"ansible_host", "cluster_address"}
        if "ansible_host" not in fields or unknown:
            raise GuideError(f"machine {name}: give ansible_host (and cluster_address where the machines have a "
                             f"network of their own){'; not ' + ', '.join(sorted(unknown)) if unknown else ''}")
    node_vars = {"gpus": gpus, "gpu_files": gpu_files, **({"gpu_type": gpu_type} if gpu_type else {})}
    children = {g: {"hosts": {head: None}} for g in ("slurm_controller", "nfs_server", "jupyterhub")}
    children["slurm_compute"] = {"hosts": {n: None for n in compute}, "vars": node_vars}
    return {"all": {"children": {"cluster": {"children": children}},
                    "hosts": {name: dict(fields) for name, fields in nodes.items()}}}


def _nodes_from_json(text: str, source: str) -> dict[str, dict[str, Any]]:
    """The machines of ``tofu output -json`` (one output, or all of them with the one named
    ``guide_nodes``) or of a plain ``{name: {...}}`` node list."""
    import json

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GuideError(f"{source} is not JSON ({exc.msg}, line {exc.lineno}); give the output of "
                         "`tofu output -json guide_nodes` or a {name: {ansible_host: ...}} list") from None
    if isinstance(data, dict) and "guide_nodes" in data:  # `tofu output -json`: every output
        data = data["guide_nodes"]
    if isinstance(data, dict) and set(data) >= {"value"} and isinstance(data.get("value"), dict):
        data = data["value"]  # one output with its type and sensitivity
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise GuideError(f"{source}: expected machines as {{name: {{ansible_host: ..., cluster_address: ...}}}}")
    return data


def main(argv: list[str] | None = None) -> int:
    """``python -m guide_utils inventory NODES.json --head NAME --gpus N --gpu-files F -o hosts.yml``"""
    import sys

    import yaml

    from ..core.cli import ArgumentParser, one_line_errors

    p = ArgumentParser(prog="python -m guide_utils inventory",
                       description="Write the playbook's hosts.yml from the machines a provisioner made "
                                   "(`tofu output -json guide_nodes`) or a testbed's node list (JSON).")
    p.add_argument("nodes", help="the JSON file, or - for standard input")
    p.add_argument("--head", required=True, help="the machine for Slurm's controller, the share and the hub")
    p.add_argument("--gpus", type=int, required=True, help="GPUs per compute node")
    p.add_argument("--gpu-files", required=True, help="their device files, e.g. /dev/nvidia[0-3]")
    p.add_argument("--gpu-type", default="", help="the GPU type in gres.conf (optional)")
    p.add_argument("-o", "--output", help="write here (refused if it exists); default: standard output")

    @one_line_errors(p.prog)
    def run(argv):
        args = p.parse_args(argv)
        if args.gpus < 1:
            raise GuideError(f"--gpus {args.gpus}: a compute node needs at least one GPU")
        source = "standard input" if args.nodes == "-" else args.nodes
        text = sys.stdin.read() if args.nodes == "-" else open(args.nodes).read()
        hosts = from_nodes(_nodes_from_json(text, source), head=args.head, gpus=args.gpus,
                           gpu_files=args.gpu_files, gpu_type=args.gpu_type)
        out = yaml.safe_dump(hosts, sort_keys=False)
        if not args.output:
            print(out, end="")
            return 0
        try:
            with open(args.output, "x") as f:  # never over a user's file
                f.write(out)
        except FileExistsError:
            raise GuideError(f"{args.output} exists; remove it or choose another --output") from None
        print(f"wrote {args.output}: {len(hosts['all']['hosts'])} machines")
        return 0

    return run(argv)
