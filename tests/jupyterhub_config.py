"""The JupyterHub of tests/test_jupyterhub.py: a real hub whose single-user servers are jobs
of the test Slurm (batchspawner's SlurmSpawner), everything on loopback.

The test starts ``jupyterhub -f tests/jupyterhub_config.py`` as root with these variables:
``GUIDE_HUB_DIR`` (its database, cookie secret and logs), ``GUIDE_HUB_PORTS`` (the public
proxy's, the hub's and the proxy API's, comma-separated), ``GUIDE_HUB_USER`` (the one local
user allowed in), ``SLURM_CONF`` (the test Slurm) and ``GUIDE_HUB_NODES`` (its node names,
which resolve only inside the test Slurm's mount namespace; here they are this host).
What a site sets instead is in book/jupyterhub.md; each setting below says which it is.
"""

import os
import sys
from pathlib import Path

from batchspawner import MultiSlurmSpawner
from traitlets import Unicode

c = get_config()  # noqa: F821 - JupyterHub's config loader provides it

venv_bin = Path(sys.executable).parent
state = Path(os.environ["GUIDE_HUB_DIR"])
public_port, hub_port, api_port = (int(p) for p in os.environ["GUIDE_HUB_PORTS"].split(","))
user = os.environ["GUIDE_HUB_USER"]

# -- the hub and its proxy: loopback only (a site: its public name, TLS, its own ports) ----
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = public_port
# Where the servers reach the hub's API (a site: an address its compute nodes reach).
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = hub_port
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.command = [str(venv_bin / "configurable-http-proxy")]  # npm's, in the venv (scripts/setup.sh)
c.ConfigurableHTTPProxy.debug = False
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True  # the hub's stop cancels every server's job
c.JupyterHub.redirect_to_server = False  # after login: the home page and its "Start My Server"
c.JupyterHub.log_level = "INFO"

# -- who may log in: the local test user, through PAM as on a login node ---------------------
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = {user}
c.PAMAuthenticator.open_sessions = False


# -- the single-user server: a job of the test Slurm -------------------------------------------
class LoopbackSlurmSpawner(MultiSlurmSpawner):
    """batchspawner's spawner for multiple-slurmd nodes, its server on loopback: batchspawner
    resets ``ip`` to the class default (0.0.0.0, every interface) at each start, so the
    default itself is changed here. (A site leaves it, or sets the compute nodes' internal
    address; its nodes are real hosts, so SlurmSpawner does.)"""

    ip = Unicode("127.0.0.1", help="where the single-user server listens").tag(config=True)


c.JupyterHub.spawner_class = LoopbackSlurmSpawner
# The node names the job runs on, as the hub reaches them (the test nodes are this host).
c.MultiSlurmSpawner.daemon_resolver = {node: "127.0.0.1" for node in os.environ["GUIDE_HUB_NODES"].split(",")}
# The hub runs as root and submits as the user: batchspawner's default is sudo -E -u {username};
# runuser (util-linux) does the same for root without a sudoers rule.
c.BatchSpawnerBase.exec_prefix = "runuser -u {username} --"
c.BatchSpawnerBase.req_runtime = "00:30:00"
c.BatchSpawnerBase.req_nprocs = "1"
c.BatchSpawnerBase.startup_poll_interval = 0.5
# The server runs as a step of its job (batchspawner's default, srun). --export=ALL: the job
# was submitted with --export=<names>, which Slurm hands on to srun (SLURM_EXPORT_ENV), so
# without it the step would not see what the script itself exports.
c.SlurmSpawner.req_srun = "srun --export=ALL"
c.BatchSpawnerBase.batchspawner_singleuser_cmd = str(venv_bin / "batchspawner-singleuser")
c.Spawner.cmd = [str(venv_bin / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 60
# What the server's job (and the notebook's kernel in it) starts with: the guide's venv first
# on PATH, the test Slurm, the CI site profile (the batch script puts the engines' logs in
# the user's home).
c.Spawner.environment = {
    "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
    "SLURM_CONF": os.environ["SLURM_CONF"],
    "GUIDE_SITE": "ci",
    "OMPI_MCA_mpi_yield_when_idle": "1",
    # the test run's id (tests/leftovers.py): a process of the server's job left running fails the run
    "GUIDE_TEST_RUN": os.environ.get("GUIDE_TEST_RUN", ""),
}
# The job's script (a site writes its own the same way: partition, account, modules).
c.SlurmSpawner.batch_script = """#!/bin/bash
#SBATCH --job-name=jupyterhub-{{username}}
#SBATCH --output={{homedir}}/jupyterhub-%j.log
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
#SBATCH --ntasks=1
#SBATCH --cpus-per-task={{nprocs}}
#SBATCH --time={{runtime}}
set -euo pipefail
export GUIDE_LOG_DIR=$HOME/logs
mkdir -p "$GUIDE_LOG_DIR"
{{prologue}}
{% if srun %}{{srun}} {% endif %}{{cmd}}
{{epilogue}}
"""
