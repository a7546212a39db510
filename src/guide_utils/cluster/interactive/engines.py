"""Train on many workers from a notebook: an ipyparallel cluster whose engines run the guide's engine.

    from guide_utils.cluster import interactive
    from guide_utils.core.config import make_config

    with interactive.EngineCluster(n=2) as cluster:        # MPI engines on this node
        result = cluster.train(make_config("smoke", dist="horovod"))
    result.run.epochs                                      # rank 0's run record, as a table

    # from a JupyterHub session on a login node: the engines as a Slurm job of your site
    with interactive.EngineCluster(n=8, engines="slurm", site="mysite", controller_ip="0.0.0.0") as cluster:
        result = cluster.train(make_config("full", dist="horovod", epochs=1, data="/scratch/me/ilsvrc2012"))

The controller runs beside the notebook; the engines run ``ipengine --mpi``, so each is an
MPI rank with MPI initialised (mpi4py) before Horovod's ``hvd.init()``: to the engine they
look exactly like processes started by ``mpirun`` or ``srun --mpi=pmix``, and
``guide_utils.engine.train`` runs unchanged. For ``--dist ddp`` each engine gets the
variables torchrun would set (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``) for the length of the run.

``engines="mpi"`` runs ``mpiexec -n N`` on the notebook's node (inside an allocation: at
most its tasks); ``engines="slurm"`` submits the engines with a batch script built from the
site profile of ``slurm_examples/sites/`` (account, partition, GPUs, software set-up).
The controller listens on loopback unless told otherwise (``controller_ip``): engines on
other nodes need ``controller_ip="0.0.0.0"`` (and ``location``, a name they can resolve).

Submitted from inside a job (a hub's server, ``salloc``), the engines' job gets none of that
job's ``SLURM_*`` variables (``runtime.slurm.submission_env``). Slurm engines wait for the
queue as long as it takes unless ``queue_timeout`` says otherwise, their job's state and
reason shown meanwhile; ``timeout`` counts from the job's start. ``ports`` keeps the
controller's engine-facing ports in a given range (a firewall's). MPI engines spread over an
allocation's nodes talk over the nodes' interface, on one host over loopback.

No silent hang: a training that stops getting anywhere (an engine dead, frozen or never
started, the launcher ended, an epoch past its deadline) stops the cluster and says so in
one line naming the engine and its last output (``watch``; ``train(deadlines=...)``).

Clean-up: leaving the ``with`` block (normally, by an exception or an interrupt), the
kernel's exit (a finalizer) and a restart stop the controller, the engines and their Slurm
job. A kernel killed outright is covered by two watchdogs (``cluster.watchdog``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import sys
import tempfile
import time
import weakref
from pathlib import Path

from ...core.config import TrainConfig
from ...core.errors import GuideError
from ...runtime.ports import LOOPBACK, free_port
from ...runtime.slurm import without_outer_job
from .. import watchdog

# The parts, a module each: the checks and what the engines start with (launch), clean-up
# (cleanup), following rank 0 (follow), what ends a run that hangs (watch) and what runs on
# the engines (remote).
from .cleanup import Resources, cleanup, job_state, queue_info
from .follow import Follower, InteractiveResult, QueueLine, follow, in_notebook, results
from .launch import (connection_info, controller_address, controller_endpoint, controller_engine_ports,
                     engine_environment, engine_port_spec, mpiexec_args, require_ipyparallel, require_mpi)
from .remote import run_on_engine, whoami
from .watch import STACKS_ON_SIGNAL as STACKS, STACKS_WAIT, Deadlines, Engine, Watch, ask_for_stacks, last_line

ENGINE_KINDS = ("mpi", "slurm")
# Seconds for the engines to register once they run (for Slurm engines: once their job has
# left the queue, which has its own limit, queue_timeout): ipyparallel's default is 60; its
# own Slurm tests raise it to 120 (a node's first import of torch from a shared filesystem).
DEFAULT_TIMEOUT = {"mpi": 60.0, "slurm": 120.0}
# The controller's sockets that the engines connect to: registration, control, mux, task,
# iopub, the two heartbeat ports and one per leaf broadcast scheduler (2 at ipyparallel's
# default depth of 1). A port range given for them (a site firewall's) must hold that many.
ENGINE_PORTS_NEEDED = 9
# Engines shut themselves down after this many missed controller heartbeats (3 s apart);
# ipyparallel's default of 50 would keep orphaned engines for minutes.
HEARTBEAT_MISSES = 10
# Seconds for registered engines to answer who they are (once asked again).
IDENTIFY_WAIT = 30.0


class EngineCluster:
    """An ipyparallel controller and ``n`` engines that train with the guide's engine; see the module doc.

    ``engines``: ``"mpi"`` (``mpiexec`` on this node) or ``"slurm"`` (a job from ``site``'s
    profile, for ``walltime``, its log in ``log_dir``). ``timeout``: seconds for the engines to
    register once they run (60 for MPI, 120 for Slurm). ``queue_timeout``: seconds the Slurm
    engines' job may wait in the queue (None, the default: as long as it takes; the state
    and Slurm's reason are shown meanwhile, and interrupting cancels the job). ``ports``:
    the controller's ports for the engines ("50000-50019", or a list; default
    $GUIDE_CONTROLLER_PORTS, else ports the kernel picks), for a firewall between the
    engines' nodes and this one. ``watch``: the job's controller watch, (seconds between
    checks, missed checks before it cancels the job). ``live``: the queue's status line as a
    display updated in place (default: inside a notebook) rather than printed lines.
    """

    def __init__(self, n: int = 2, *, engines: str = "mpi", site: str | None = None, controller_ip: str | None = None,
                 location: str | None = None, timeout: float | None = None, queue_timeout: float | None = None,
                 ports: str | list[int] | None = None, walltime: str = "01:00:00",
                 log_dir: str | os.PathLike | None = None, mpi_args: list[str] | None = None,
                 watch: tuple[float, int] = (5.0, 3), live: bool | None = None):
        if engines not in ENGINE_KINDS:
            raise GuideError(f"engines={engines!r}: choose 'mpi' (this node) or 'slurm' (a Slurm job)")
        if not isinstance(n, int) or n < 1:
            raise GuideError(f"n={n!r}: the number of engines must be a positive integer")
        self.n, self.engines, self.site_name, self.walltime, self.watch = n, engines, site, walltime, watch
        self.controller_ip = controller_address(controller_ip)
        self.location = location
        self.timeout = float(timeout if timeout is not None else DEFAULT_TIMEOUT[engines])
        self.queue_timeout = None if queue_timeout is None else float(queue_timeout)
        self.ports = engine_port_spec(ports if ports is not None else os.environ.get("GUIDE_CONTROLLER_PORTS"),
                                      ENGINE_PORTS_NEEDED)
        self.live = live
        self.engine_ports: dict[str, int | list[int]] = {}  # the controller's, once started
        self.log_dir = Path(log_dir) if log_dir else None
        self.mpi_args = mpi_args
        self.site = None
        self.job_id: str | None = None
        self.log_path: Path | None = None
        self._res: Resources | None = None
        self._finalizer = None
        self.last_watch: Watch | None = None  # the last training's: its deadlines, when it found a problem
        self._engines: list[Engine] = []  # MPI rank order
        self._ranks: list[int] = []  # their engine ids
        self._hosts: list[str] = []

    def __enter__(self) -> "EngineCluster":
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def __repr__(self) -> str:
        where = f"Slurm job {self.job_id}" if self.job_id else self.engines
        return f"<EngineCluster {self.cluster_id or '(not started)'}: {self.n} engines ({where})>"

    @property
    def cluster_id(self) -> str | None:
        return self._res.cluster_id if self._res else None

    @property
    def running(self) -> bool:
        return self._finalizer is not None and self._finalizer.alive

    @property
    def client(self):
        return self._res.client if self.running else None

    def start(self) -> "EngineCluster":
        """Start the controller and the engines; wait until all ``n`` registered."""
        ipp = require_ipyparallel()
        if self.running:
            return self
        if self.engines == "mpi":
            require_mpi(self.n)
        else:
            from .. import sites

            self.site = sites.read_site(self.site_name)
            sites.check_against_cluster(self.site, self.n)
        cid = f"guide-{int(time.time())}-{secrets.token_hex(3)}"
        base = self._log_dir() if self.engines == "slurm" else None  # the engines' nodes must see it
        profile_dir = tempfile.mkdtemp(prefix=f"ipp-{cid}-", dir=base)
        res = self._res = Resources(cid, profile_dir, Path(profile_dir) / "guide-cluster.json")
        res.save()
        self._finalizer = weakref.finalize(self, cleanup, res)
        res.reaper = watchdog.start_reaper(res.state_file)
        try:
            self._launch(ipp, res)
            self._wait_for_engines(res)
            self._identify(res)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the engines (cancel their job), the controller and the client; idempotent."""
        if self._finalizer is not None:
            self._finalizer()

    def _log_dir(self) -> Path:
        from ...core.paths import repo_root

        d = self.log_dir or Path(os.environ.get("GUIDE_LOG_DIR") or repo_root() / "logs")
        d.mkdir(parents=True, exist_ok=True)
        return d.resolve()

    def _launch(self, ipp, res: Resources) -> None:
        ports = [f"--IPController.engine_ports={self.ports}"] if self.ports else []
        cluster = res.cluster = ipp.Cluster(
            engines=self.engines, cluster_id=res.cluster_id, profile_dir=res.profile_dir,
            controller_ip=self.controller_ip, controller_location=self.location or "", engine_timeout=int(self.timeout),
            controller_args=ports, delay=0, load_profile=False, log_level=logging.ERROR)
        cluster.start_controller_sync()
        info = connection_info(res.profile_dir, res.cluster_id)
        endpoint = controller_endpoint(info)
        self.engine_ports = controller_engine_ports(info)
        env = engine_environment(self.engines, self.n)
        beats = [f"--IPEngine.max_heartbeat_misses={HEARTBEAT_MISSES}", f"--IPEngine.startup_command={STACKS}"]
        if self.engines == "mpi":
            cluster.start_engines_sync(self.n, environment=env, engine_args=beats,
                                       mpi_args=self.mpi_args if self.mpi_args is not None else mpiexec_args())
        else:
            from ..sites import engines_batch_script

            log = self._log_dir() / f"ipengine-{res.cluster_id}-%j.out"
            script = engines_batch_script(self.site, self.n, walltime=self.walltime, log=str(log),
                                          controller=endpoint, watch=self.watch)
            # the script beside its log (ipyparallel would write it to the current folder);
            # submitted without the SLURM_* variables of a job this kernel may run in
            cluster.start_engines_sync(self.n, environment=env, engine_cmd=["python", "-m", "ipyparallel.engine"],
                                       engine_args=["--mpi", *beats], batch_template=script,
                                       batch_file_name=str(self._log_dir() / f"ipengine-{res.cluster_id}.sbatch"),
                                       submit_command=without_outer_job(["sbatch"]))
            self.job_id = str(cluster.engine_set.job_id)
            self.log_path = Path(str(log).replace("%j", self.job_id))
            res.jobs.append(self.job_id)
            res.save()
        res.client = cluster.connect_client_sync()

    def _wait_for_engines(self, res: Resources) -> None:
        """Until all ``n`` engines registered. MPI engines: ``timeout`` from now. Slurm
        engines: first the queue (the job's state and reason shown, up to ``queue_timeout``,
        by default without limit), then ``timeout`` from the moment the job runs."""
        start = time.monotonic()
        running = start if self.engines == "mpi" else None
        line = None if self.engines == "mpi" else QueueLine(self.job_id, self.queue_timeout,
                                                             in_notebook() if self.live is None else self.live)
        checked = 0.0
        while len(res.client.ids) < self.n:
            now = time.monotonic()
            if running is not None and now - running > self.timeout:
                raise self._not_up(res, f"did not all register within {self.timeout:.0f} s of their start")
            if now - checked > 2:
                checked = now
                if self.engines == "mpi":
                    ended = self._engines_ended(res)
                    if ended:
                        raise self._not_up(res, ended)
                    continue
                info = queue_info(self.job_id)
                if info is None:
                    raise self._not_up(res, "ended: the job left the queue")
                if info[0] in ("PENDING", "CONFIGURING", "REQUEUED", "SUSPENDED") and running is None:
                    line.update(*info)
                    if self.queue_timeout is not None and now - start > self.queue_timeout:
                        limit = f"{self.queue_timeout:g}"
                        raise GuideError(f"the engines' Slurm job {self.job_id} is still {info[0]} ({info[1]}) after "
                                         f"{limit} s in the queue (queue_timeout={limit}); "
                                         "it was cancelled. Wait longer (queue_timeout=None waits as long as it "
                                         "takes), ask for fewer engines or a shorter walltime, or try a "
                                         "test/debug partition")
                elif running is None:
                    running = now
                    line.update(*info)
            time.sleep(0.25)

    def _engines_ended(self, res: Resources | None) -> str | None:
        """How the engines' launcher ended (mpiexec's exit and last line; the Slurm job's
        state), or None while it runs."""
        if res is None or res.cluster is None:
            return "the cluster was stopped"
        if self.engines == "mpi":
            es = res.cluster.engine_set
            if es is None or es.state != "after":
                return None
            return f"ended (mpiexec exited: {es.stop_data}; its last line: {last_line(es.get_output(remove=False))})"
        state = job_state(self.job_id)
        if state in ("RUNNING", "COMPLETING"):
            return None
        return f"ended: Slurm job {self.job_id} is {state}" if state else "ended: the job left the queue"

    def _not_up(self, res: Resources, reason: str) -> GuideError:
        """Print the tail of the engines' log; the one-line error that names job, log and likely cause."""
        up = len(res.client.ids)
        where = "MPI engines (mpiexec)" if self.engines == "mpi" else \
            f"engines of Slurm job {self.job_id} ({job_state(self.job_id) or 'gone'})"
        log = self._show_output(res, 15)
        hint = ""
        from ...runtime.slurm import SlurmJob

        job = SlurmJob.from_env()
        elsewhere = self.engines == "slurm" or (job is not None and job.num_nodes > 1)
        if elsewhere and self.controller_ip.startswith("127."):
            hint = f"; engines on other nodes cannot reach {self.controller_ip}: pass controller_ip='0.0.0.0'"
        return GuideError(f"{up} of the {self.n} {where} {reason}; see {log} (above), the controller address "
                          f"{self.controller_ip}{hint}, and raise timeout= if the engines start slowly")

    def _show_output(self, res: Resources | None, lines: int) -> str:
        """Print the last ``lines`` of the engines' output (mpiexec's; the Slurm job's log);
        what it is called."""
        es = res.cluster.engine_set if res is not None and res.cluster is not None else None
        path = Path(es.output_file) if self.engines == "mpi" and es is not None and es.output_file else self.log_path
        tail = path.read_text(errors="replace") if path and path.exists() else ""
        log = "their output" if self.engines == "mpi" else f"its log {self.log_path}"
        shown = tail.strip().splitlines()[-lines:] or ["(empty: the job has not started)"]
        print(f"--- the last lines of {log}:\n" + "\n".join(shown), flush=True)
        return log

    def _stacks(self) -> str:
        """Every engine's threads' stacks, into its output and shown (a run that hangs); where."""
        ask_for_stacks(self._engines, self.job_id)
        time.sleep(STACKS_WAIT)
        return f"{self._show_output(self._res, 120)} above, with every engine's stacks"

    def _identify(self, res: Resources) -> None:
        from ipyparallel.error import TimeoutError as NoAnswer

        ids = sorted(res.client.ids)[: self.n]
        # A request sent just as the engines registered was once never answered (in CI: 20 min,
        # engines alive): asked again after IDENTIFY_WAIT, then given up on in one line.
        for attempt in (1, 2):
            try:
                info = res.client[ids].apply_async(whoami).get(timeout=IDENTIFY_WAIT)
                break
            except NoAnswer:
                if attempt == 2:
                    raise self._not_up(res, f"registered but did not answer within {2 * IDENTIFY_WAIT:.0f} s") \
                        from None
        ranks = sorted(zip(ids, info, strict=True), key=lambda pair: pair[1][0])
        sizes = {size for _, (_, size, *_) in ranks}
        if sizes != {self.n}:
            raise GuideError(f"the {self.n} engines are not one MPI world (sizes {sorted(sizes)}): their launcher "
                             "started each alone; check the site's GUIDE_SRUN_MPI (srun --mpi=list)")
        self._engines = [Engine(eid, rank, host, pid) for eid, (rank, _, host, pid) in ranks]
        self._ranks = [e.eid for e in self._engines]
        self._hosts = [e.host for e in self._engines]

    def train(self, cfg: TrainConfig, *, live: bool | None = None, progress: bool = True,
              timeout: float | None = None, deadlines: Deadlines | None = None) -> InteractiveResult:
        """Run ``guide_utils.engine.train(cfg)`` on every engine, as one ``cfg.dist`` job.

        Rank 0's lines are printed as they come, under a progress bar over the epochs; with
        ``live`` (default: inside a notebook) its run record is drawn after every epoch.
        Interrupting stops the cluster: engines inside a collective cannot be reused. So does
        a run that stops getting anywhere (an engine dead, frozen or never started; the
        launcher ended; an epoch past its deadline, ``deadlines``: see ``watch``), in one line
        naming the engine and its last output; ``timeout`` bounds the whole run.
        """
        if not self.running:
            raise GuideError("the cluster is not running: call start() first, or use it in a with block")
        if cfg.dist not in ("horovod", "ddp"):
            raise GuideError(f"dist={cfg.dist!r} on {self.n} engines would train {self.n} separate models; "
                             "use dist='horovod' or dist='ddp'")
        cfg = dataclasses.replace(cfg, results_dir=str(Path(cfg.results_dir).resolve()), progress=False)
        cfg.validate()
        client = self._res.client
        rendezvous = None
        if cfg.dist == "ddp":  # rank 0's host, as torchrun's --standalone / the Slurm path choose
            host = LOOPBACK if self.engines == "mpi" and len(set(self._hosts)) == 1 else self._hosts[0]
            rendezvous = (host, client[self._ranks[0]].apply_sync(free_port, host))
        ar = client[self._ranks].apply_async(run_on_engine, cfg, rendezvous)
        follower = Follower(cfg, self.n, in_notebook() if live is None else live, progress)
        where = "their output" if self.engines == "mpi" else f"the engines' log {self.log_path}"
        watch = self.last_watch = Watch(self._engines, deadlines or Deadlines(), lambda: self._engines_ended(self._res),
                                        where, timeout, on_hang=self._stacks)
        try:
            follow(ar, follower, watch, client, self.stop)
        except KeyboardInterrupt:
            self.stop()
            print("interrupted: the engines were stopped", file=sys.stderr)
            raise
        finally:
            follower.close()
        return InteractiveResult(cfg.dist, results(ar))

