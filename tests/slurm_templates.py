"""DRAFT (issue 25, not used by the suite yet): the tests' slurm.conf and gres.conf rendered
from the Ansible role's own templates (ansible/roles/slurm/templates), so that the Slurm the
tests start is configured by what the playbook installs.

Where it plugs in: ``SlurmCluster.start`` in tests/slurm_cluster.py writes slurm.conf from an
f-string and ``SlurmCluster._fake_gpus`` writes gres.conf; both become

    values = slurm_templates.test_values(root=r, host=host, ctld_port=ctld_port,
                                         node_ports=node_ports, layout=layout, socket=sock,
                                         first_job_id=first_job_id(), gpus_per_node=GPUS_PER_NODE,
                                         oversubscribe=OVERSUBSCRIBE, nodes=NODES)
    self.conf.write_text(slurm_templates.render("slurm.conf", values))
    (r / "gres.conf").write_text(slurm_templates.render("gres.conf", values))

(``_fake_gpus`` keeps making the device files; it stops writing gres.conf.) The munge key
stays ``mungekey --create --keyfile=...``, the command the munge role runs.

The templates use core Jinja2 only (no Ansible filters, lookups or facts), rendered here as
Ansible's template module renders them: trim_blocks on, lstrip_blocks off, the file's last
newline kept; StrictUndefined, so a variable the role adds and the tests do not set fails
the tests instead of rendering as an empty string. Jinja2 is already in the guide's lock.
"""

from __future__ import annotations

from pathlib import Path

import jinja2

TEMPLATES = Path(__file__).resolve().parents[1] / "ansible" / "roles" / "slurm" / "templates"
HEADER = "The tests' Slurm (tests/slurm_cluster.py), from ansible/roles/slurm/templates"


def environment() -> jinja2.Environment:
    """Jinja2 set up as Ansible's template module sets it up."""
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), trim_blocks=True,
                              lstrip_blocks=False, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)


def render(name: str, values: dict) -> str:
    """``name`` (slurm.conf, gres.conf, cgroup.conf) rendered with ``values``."""
    return environment().get_template(f"{name}.j2").render(**values)


def test_values(*, root: Path, host: str, ctld_port: int, node_ports: list[int], layout: str, socket: Path,
                first_job_id: int, gpus_per_node: int, oversubscribe: int, nodes: tuple[str, ...],
                real_memory: int = 4000, partition: str = "ci") -> dict:
    """The role's variables for the tests' two-node Slurm on loopback: every file under
    ``root``, the nodes this host (Slurm's multiple-slurmd mode, one port each), fake GPUs
    on device files under ``root/dev-NODE``. These are the values of
    ansible/inventories/test-local (the local-apply test), less what that test picks itself."""
    r = Path(root)
    return {
        "slurm_header": HEADER,
        "slurm_cluster_name": "guideci",
        # Job ids of this cluster's own range: a DDP job's rendezvous port is 20000 + its id,
        # and a test Slurm of another pytest-xdist worker may run at the same time here.
        "slurm_first_job_id": first_job_id,
        "slurm_controller_name": host,
        "slurm_controller_addr": "127.0.0.1",
        "slurm_ctld_port": ctld_port,
        "slurm_srun_port_range": "",
        "slurm_user": "root",
        "slurm_slurmd_user": "root",
        # cred_expire also sets how long a requeued job waits before it may start again
        # (120 s by default): short here, so the requeue test takes seconds.
        "slurm_auth_info": [f"socket={socket}", "cred_expire=10"],
        "slurm_communication_parameters": ["NoCtldInAddrAny", "NoInAddrAny"],
        "slurm_state_dir": f"{r}/state",
        "slurm_spool_dir": f"{r}/spool-%n",
        "slurm_ctld_pid_file": f"{r}/slurmctld.pid",
        "slurm_slurmd_pid_file": f"{r}/slurmd-%n.pid",
        "slurm_log_dir": f"{r}/log",
        "slurm_per_node_suffix": "-%n",
        "slurm_tmpfs": f"{r}/tmpfs-%n",
        "slurm_proctrack_type": "proctrack/linuxproc",
        "slurm_task_plugin": ["task/affinity"],
        "slurm_task_plugin_param": "None",
        "slurm_gres_types": ["gpu"],
        "slurm_gres_autodetect": "off",
        "slurm_select_type_parameters": "CR_CPU",
        "slurm_mpi_default": "none",
        "slurm_scheduler_parameters": ["sched_interval=2", "bf_interval=2"],
        "slurm_min_job_age": 3600,
        "slurm_kill_wait": 10,
        "slurm_extra_config": [],
        "slurm_cgroup_plugin": "autodetect",
        "slurm_nodes": [
            {"name": n, "hostname": host, "addr": "127.0.0.1", "port": p, "hardware": layout,
             "real_memory": real_memory, "gpus": gpus_per_node, "gpu_type": "",
             "gpu_files": f"{r}/dev-{n}/nvidia[0-{gpus_per_node - 1}]"}
            for n, p in zip(nodes, node_ports)],
        "slurm_partitions": [{"name": partition, "nodes": list(nodes), "default": True, "max_time": "INFINITE",
                              "oversubscribe": f"FORCE:{oversubscribe}"}],
    }


def template_variables() -> set[str]:
    """Every variable the three templates read: the role's defaults/main.yml must define each
    one, and ``test_values`` must give each one (a test can check both)."""
    import jinja2.meta

    env = environment()
    names: set[str] = set()
    for name in ("slurm.conf", "gres.conf", "cgroup.conf"):
        source = (TEMPLATES / f"{name}.j2").read_text()
        names |= jinja2.meta.find_undeclared_variables(env.parse(source))
    return names
