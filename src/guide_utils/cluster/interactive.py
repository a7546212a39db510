"""Train on many workers from a notebook: an ipyparallel cluster whose engines run the guide's engine.

    from guide_utils.cluster import interactive
    from guide_utils.core.config import make_config

    with interactive.EngineCluster(n=2) as cluster:        # MPI engines on this node
        result = cluster.train(make_config("smoke", dist="horovod"))
    result.run.epochs                                      # rank 0's run record, as a table

    # from a JupyterHub session on a login node: the engines as a Slurm job of your site
    with interactive.EngineCluster(n=8, engines="slurm", site="mysite", controller_ip="0.0.0.0") as cluster:
        result = cluster.train(make_config("full", dist="horovod", epochs=1))

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

Clean-up: leaving the ``with`` block (normally, by an exception or an interrupt), the
kernel's exit (a finalizer) and a restart stop the controller, the engines and their Slurm
job. A kernel killed outright is covered by two watchdogs (``cluster.watchdog``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.config import TrainConfig
from ..core.errors import GuideError
from . import watchdog

ENGINE_KINDS = ("mpi", "slurm")
# Seconds to wait for the engines to register: ipyparallel's default is 60; its own Slurm
# tests raise it to 120 (a queue, a node's first import of torch from a shared filesystem).
DEFAULT_TIMEOUT = {"mpi": 60.0, "slurm": 120.0}
LOOPBACK = "127.0.0.1"
# Engines shut themselves down after this many missed controller heartbeats (3 s apart);
# ipyparallel's default of 50 would keep orphaned engines for minutes.
HEARTBEAT_MISSES = 10
EPOCH_LINE = re.compile(r"^\[train\] epoch (\d+)/(\d+)")
RECORD = re.compile(r"; record (\S+\.jsonl)$")


@dataclass
class InteractiveResult:
    """One training on the engines: every rank's result, rank 0 first."""

    dist: str
    results: list = field(default_factory=list)  # engine.loop.RunResult per rank

    @property
    def workers(self) -> int:
        return len(self.results)

    @property
    def record_path(self) -> Path:
        return Path(self.results[0].record_path)

    @property
    def digests(self) -> list[str]:
        return [r.weights_digest for r in self.results]

    @property
    def run(self):
        from ..core.records import read_run

        return read_run(self.record_path)


def require_ipyparallel():
    """ipyparallel, or one line saying how to get it."""
    try:
        import ipyparallel
    except ImportError:
        raise GuideError(f"ipyparallel is not installed in this kernel's environment ({sys.executable}); install "
                         "the guide's pins: pip install -r requirements.txt (ipyparallel==9.2.0, mpi4py)") from None
    return ipyparallel


def _require_mpi(n: int) -> None:
    if importlib.util.find_spec("mpi4py") is None:
        raise GuideError(f"mpi4py is not installed in this kernel's environment ({sys.executable}); MPI engines need "
                         "it: pip install -r requirements.txt (mpi4py, built against your MPI)")
    if not shutil.which("mpiexec"):
        raise GuideError("mpiexec not found: load your MPI (module load ...) or apt-get install openmpi-bin; "
                         "or use engines='slurm'")
    from ..runtime.slurm import SlurmJob

    job = SlurmJob.from_env()
    if job is not None and n > job.ntasks:
        raise GuideError(f"{n} engines asked for, but this Slurm job ({job.job_id}) has {job.ntasks} task(s); "
                         f"ask for at most {job.ntasks}, or start the session with more tasks")


def controller_address(ip: str | None) -> str:
    """Where the controller listens: ``ip``, else $GUIDE_CONTROLLER_IP, else loopback."""
    return ip or os.environ.get("GUIDE_CONTROLLER_IP") or LOOPBACK


@dataclass
class _Resources:
    """What a running cluster holds; the finalizer gets this, never the EngineCluster."""

    cluster_id: str
    profile_dir: str
    state_file: Path
    cluster: Any = None
    client: Any = None
    jobs: list[str] = field(default_factory=list)
    reaper: Any = None

    def save(self) -> None:
        self.state_file.write_text(json.dumps({"cluster_id": self.cluster_id, "jobs": self.jobs,
                                               "profile_dir": self.profile_dir}))


def _cleanup(res: _Resources) -> None:
    """Stop everything ``res`` holds; safe to call twice, at exit, or after a failed start."""
    if res.client is not None:
        try:
            res.client.close()
        except Exception:  # noqa: BLE001 - clean-up goes on whatever happened
            pass
        res.client = None
    if res.cluster is not None:
        try:
            res.cluster.stop_cluster_sync()
        except Exception:  # noqa: BLE001
            pass
        res.cluster = None
    watchdog.reap({"cluster_id": res.cluster_id, "jobs": res.jobs})
    _wait_jobs_gone(res.jobs)
    res.state_file.unlink(missing_ok=True)  # the reaper sees it gone and exits
    shutil.rmtree(res.profile_dir, ignore_errors=True)


def job_state(job_id: str) -> str | None:
    """The Slurm job's state as squeue shows it, or None once it has left the queue."""
    out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True, timeout=60)
    state = out.stdout.strip()
    return None if out.returncode != 0 or state in ("", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT") else state


def _wait_jobs_gone(jobs: list[str], timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while jobs and shutil.which("squeue") and time.monotonic() < end:
        if all(job_state(j) is None for j in jobs):
            return
        time.sleep(0.5)


class EngineCluster:
    """An ipyparallel controller and ``n`` engines that train with the guide's engine; see the module doc.

    ``engines``: ``"mpi"`` (``mpiexec`` on this node) or ``"slurm"`` (a job from ``site``'s
    profile, for ``walltime``, its log in ``log_dir``). ``timeout``: seconds for the engines to
    register (60 for MPI, 120 for Slurm). ``watch``: the job's controller watch, (seconds
    between checks, missed checks before it cancels the job).
    """

    def __init__(self, n: int = 2, *, engines: str = "mpi", site: str | None = None, controller_ip: str | None = None,
                 location: str | None = None, timeout: float | None = None, walltime: str = "01:00:00",
                 log_dir: str | os.PathLike | None = None, mpi_args: list[str] | None = None,
                 watch: tuple[float, int] = (5.0, 3)):
        if engines not in ENGINE_KINDS:
            raise GuideError(f"engines={engines!r}: choose 'mpi' (this node) or 'slurm' (a Slurm job)")
        if not isinstance(n, int) or n < 1:
            raise GuideError(f"n={n!r}: the number of engines must be a positive integer")
        self.n, self.engines, self.site_name, self.walltime, self.watch = n, engines, site, walltime, watch
        self.controller_ip = controller_address(controller_ip)
        self.location = location
        self.timeout = float(timeout if timeout is not None else DEFAULT_TIMEOUT[engines])
        self.log_dir = Path(log_dir) if log_dir else None
        self.mpi_args = mpi_args
        self.site = None
        self.job_id: str | None = None
        self.log_path: Path | None = None
        self._res: _Resources | None = None
        self._finalizer = None
        self._ranks: list[int] = []  # engine ids in MPI rank order
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
            _require_mpi(self.n)
        else:
            from . import sites

            self.site = sites.read_site(self.site_name)
            sites.check_against_cluster(self.site, self.n)
        cid = f"guide-{int(time.time())}-{secrets.token_hex(3)}"
        base = self._log_dir() if self.engines == "slurm" else None  # the engines' nodes must see it
        profile_dir = tempfile.mkdtemp(prefix=f"ipp-{cid}-", dir=base)
        res = self._res = _Resources(cid, profile_dir, Path(profile_dir) / "guide-cluster.json")
        res.save()
        self._finalizer = weakref.finalize(self, _cleanup, res)
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
        from .sites import guide_root

        d = self.log_dir or Path(os.environ.get("GUIDE_LOG_DIR") or guide_root() / "logs")
        d.mkdir(parents=True, exist_ok=True)
        return d.resolve()

    def _launch(self, ipp, res: _Resources) -> None:
        cluster = res.cluster = ipp.Cluster(
            engines=self.engines, cluster_id=res.cluster_id, profile_dir=res.profile_dir,
            controller_ip=self.controller_ip, controller_location=self.location or "", engine_timeout=int(self.timeout),
            delay=0, load_profile=False, log_level=logging.ERROR)
        cluster.start_controller_sync()
        endpoint = _controller_endpoint(res.profile_dir, res.cluster_id)
        env = _engine_environment(self.engines, self.n)
        beats = [f"--IPEngine.max_heartbeat_misses={HEARTBEAT_MISSES}"]
        if self.engines == "mpi":
            cluster.start_engines_sync(self.n, environment=env, engine_args=beats,
                                       mpi_args=self.mpi_args if self.mpi_args is not None else _mpi_args())
        else:
            from .sites import engines_batch_script

            log = self._log_dir() / f"ipengine-{res.cluster_id}-%j.out"
            script = engines_batch_script(self.site, self.n, walltime=self.walltime, log=str(log),
                                          controller=endpoint, watch=self.watch)
            # the script beside its log (ipyparallel would write it to the current folder)
            cluster.start_engines_sync(self.n, environment=env, engine_cmd=["python", "-m", "ipyparallel.engine"],
                                       engine_args=["--mpi", *beats], batch_template=script,
                                       batch_file_name=str(self._log_dir() / f"ipengine-{res.cluster_id}.sbatch"))
            self.job_id = str(cluster.engine_set.job_id)
            self.log_path = Path(str(log).replace("%j", self.job_id))
            res.jobs.append(self.job_id)
            res.save()
        res.client = cluster.connect_client_sync()

    def _wait_for_engines(self, res: _Resources) -> None:
        end = time.monotonic() + self.timeout
        checked = 0.0
        while len(res.client.ids) < self.n:
            if time.monotonic() > end:
                raise self._not_up(res, f"did not all register within {self.timeout:.0f} s")
            if time.monotonic() - checked > 2:
                checked = time.monotonic()
                ended = self._engines_ended(res)
                if ended:
                    raise self._not_up(res, ended)
            time.sleep(0.25)

    def _engines_ended(self, res: _Resources) -> str | None:
        if self.engines == "mpi":
            es = res.cluster.engine_set
            return f"ended (mpiexec exited: {es.stop_data})" if es is not None and es.state == "after" else None
        return None if job_state(self.job_id) else "ended: the job left the queue"

    def _not_up(self, res: _Resources, reason: str) -> GuideError:
        """Print the tail of the engines' log; the one-line error that names job, log and likely cause."""
        up = len(res.client.ids)
        if self.engines == "mpi":
            tail = (res.cluster.engine_set.get_output(remove=False) if res.cluster.engine_set else "") or ""
            where, log = "MPI engines (mpiexec)", "their output"
        else:
            tail = self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""
            state = job_state(self.job_id) or "gone"
            where, log = f"engines of Slurm job {self.job_id} ({state})", f"its log {self.log_path}"
        lines = tail.strip().splitlines()[-15:] or ["(empty: the job has not started)"]
        print(f"--- the last lines of {log}:\n" + "\n".join(lines), flush=True)
        hint = ""
        from ..runtime.slurm import SlurmJob

        job = SlurmJob.from_env()
        elsewhere = self.engines == "slurm" or (job is not None and job.num_nodes > 1)
        if elsewhere and self.controller_ip.startswith("127."):
            hint = f"; engines on other nodes cannot reach {self.controller_ip}: pass controller_ip='0.0.0.0'"
        return GuideError(f"{up} of the {self.n} {where} {reason}; see {log} (above), the controller address "
                          f"{self.controller_ip}{hint}, and raise timeout= if the queue is slow")

    def _identify(self, res: _Resources) -> None:
        ids = sorted(res.client.ids)[: self.n]
        info = res.client[ids].apply_sync(_whoami)
        ranks = sorted(zip(ids, info, strict=True), key=lambda pair: pair[1][0])
        sizes = {size for _, (_, size, _) in ranks}
        if sizes != {self.n}:
            raise GuideError(f"the {self.n} engines are not one MPI world (sizes {sorted(sizes)}): their launcher "
                             "started each alone; check the site's GUIDE_SRUN_MPI (srun --mpi=list)")
        self._ranks = [eid for eid, _ in ranks]
        self._hosts = [host for _, (_, _, host) in ranks]

    def train(self, cfg: TrainConfig, *, live: bool | None = None, progress: bool = True,
              timeout: float | None = None) -> InteractiveResult:
        """Run ``guide_utils.engine.train(cfg)`` on every engine, as one ``cfg.dist`` job.

        Rank 0's lines are printed as they come, under a progress bar over the epochs; with
        ``live`` (default: inside a notebook) its run record is drawn after every epoch.
        Interrupting stops the cluster: engines inside a collective cannot be reused.
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
            rendezvous = (host, client[self._ranks[0]].apply_sync(_free_port, host))
        ar = client[self._ranks].apply_async(_run_on_engine, cfg, rendezvous)
        follower = _Follower(cfg, self.n, _in_notebook() if live is None else live, progress)
        try:
            end = None if timeout is None else time.monotonic() + timeout
            while not ar.ready():
                ar.wait(0.5)
                follower.feed(ar.stdout[0])
                if end is not None and time.monotonic() > end:
                    self.stop()
                    raise GuideError(f"the training did not finish within {timeout:.0f} s; the cluster was stopped")
            follower.feed(ar.stdout[0] + "\n")
        except KeyboardInterrupt:
            self.stop()
            print("interrupted: the engines were stopped", file=sys.stderr)
            raise
        finally:
            follower.close()
        return InteractiveResult(cfg.dist, _results(ar))


def _results(ar) -> list:
    """The engines' return values; a GuideError raised on an engine becomes this one line."""
    from ipyparallel.error import CompositeError, RemoteError

    try:
        return list(ar.get())
    except (CompositeError, RemoteError) as exc:
        errors = getattr(exc, "elist", None) or [(getattr(exc, "ename", ""), getattr(exc, "evalue", ""))]
        for ename, evalue, *_ in errors:
            if ename == "GuideError":
                raise GuideError(f"on the engines: {evalue}") from None
        raise


class _Follower:
    """Rank 0's output as it arrives: its [train] lines, a progress bar over the epochs, and
    (``live``, in a notebook) a figure of its run record redrawn after every epoch. In a
    notebook the bar is one display updated in place (a text bar would add a line per
    refresh); elsewhere it is tqdm's."""

    def __init__(self, cfg: TrainConfig, n: int, live: bool, progress: bool):
        from tqdm import tqdm

        self.seen, self.record, self.done, self.total = 0, None, 0, cfg.epochs
        self.desc, self.start, self.meter, self.bar = f"{cfg.dist} on {n} engines", time.monotonic(), None, None
        if progress and live:
            from IPython.display import display

            self.meter = display({"text/plain": self._meter_text()}, raw=True, display_id=True)
        elif progress:
            self.bar = tqdm(total=cfg.epochs, desc=self.desc, unit="epoch", file=sys.stdout, ncols=80, mininterval=0)
        self.plot = _LivePlot(f"{cfg.model} on {cfg.data}, {cfg.dist} x {n} (live)") if live else None

    def _meter_text(self) -> str:
        from tqdm import tqdm

        return tqdm.format_meter(self.done, self.total, time.monotonic() - self.start, ncols=80, prefix=self.desc,
                                 unit="epoch")

    def feed(self, text: str) -> None:
        cut = text.rfind("\n") + 1
        for line in text[self.seen:cut].splitlines():
            if not line.startswith("[train]"):
                continue  # only the engine's own compact lines: Jupyter limits output rates
            # The record by its name (its folder is the notebook's results directory), wrapped
            # to the width of a notebook's (and the book's) output column.
            record = RECORD.search(line)
            brief = line.replace(record.group(1), Path(record.group(1)).name) if record else line
            shown = "\n".join(textwrap.wrap(brief, 96, subsequent_indent="    ", break_long_words=False,
                                             break_on_hyphens=False)) or brief
            self.bar.write(shown, file=sys.stdout) if self.bar else print(shown, flush=True)
            if match := RECORD.search(line):
                self.record = match.group(1)
            if match := EPOCH_LINE.match(line):
                self._advance(int(match.group(1)))
        self.seen = max(self.seen, cut)

    def _advance(self, epoch: int) -> None:
        if self.bar:
            self.bar.update(epoch - self.bar.n)
        self.done = epoch
        if self.meter:
            self.meter.update({"text/plain": self._meter_text()}, raw=True)
        if self.plot and self.record:
            self.plot.update(self.record)

    def close(self) -> None:
        if self.bar:
            self.bar.close()


class _LivePlot:
    def __init__(self, title: str):
        import matplotlib.pyplot as plt
        from IPython.display import display

        self.fig, self.ax = plt.subplots(figsize=(6, 3.2))
        self.title = title
        self.handle = display(self.fig, display_id=True)
        plt.close(self.fig)  # shown through the handle only

    def update(self, record: str) -> None:
        from ..core.records import read_run

        epochs = read_run(record).epochs
        self.ax.clear()
        self.ax.plot(epochs["epoch"], epochs["train_top1_err"], "s--", label="training")
        self.ax.plot(epochs["epoch"], epochs["val_top1_err"], "o-", label="validation")
        self.ax.set(xlabel="epoch", ylabel="top-1 error (%)", title=self.title)
        self.ax.title.set_fontsize(9)
        self.ax.legend(fontsize=8)
        self.handle.update(self.fig)


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def _controller_endpoint(profile_dir: str, cluster_id: str, timeout: float = 30) -> tuple[str, int]:
    """(host, registration port) at which the engines reach the controller."""
    path = Path(profile_dir) / "security" / f"ipcontroller-{cluster_id}-engine.json"
    end = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > end:
            raise GuideError(f"the ipyparallel controller wrote no connection file ({path}) in {timeout:.0f} s")
        time.sleep(0.1)
    info = json.loads(path.read_text())
    host = info["interface"].split("://", 1)[-1]
    if host in ("0.0.0.0", "*"):
        host = info.get("location") or socket.gethostname()
    return host, int(info["registration"])


def _engine_environment(engines: str, n: int) -> dict[str, str]:
    """What the engines need besides the notebook's own environment: this guide_utils on
    their path and, on this node, the batch path's settings (launch.environment). When the
    engines have no core to spare (the kernel and the controller share the node with them),
    OpenMPI yields while it waits instead of spinning: changes no number, and on two cores
    halved the time of a 2-engine Horovod run."""
    env = {"PYTHONPATH": watchdog._pythonpath(), "PYTHONUNBUFFERED": "1"}
    if engines == "mpi":
        from ..runtime.launch import environment

        full = environment()
        env.update({k: v for k, v in full.items() if os.environ.get(k) != v})
        if n >= (os.cpu_count() or 1):
            env.setdefault("OMPI_MCA_mpi_yield_when_idle", os.environ.get("OMPI_MCA_mpi_yield_when_idle", "1"))
    return env


def _mpi_args() -> list[str]:
    """OpenMPI's mpiexec: more engines than cores is allowed, and no core binding (the
    engines' own threads decide), as launch.command('mpirun') does."""
    out = subprocess.run(["mpiexec", "--version"], capture_output=True, text=True, timeout=30)
    return ["--oversubscribe", "--bind-to", "none"] if "Open MPI" in out.stdout + out.stderr else []


# -- run on the engines (imported there by name) --------------------------------------------

def _whoami() -> tuple[int, int, str]:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size(), socket.gethostname()


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _run_on_engine(cfg: TrainConfig, rendezvous: tuple[str, int] | None):
    """One rank of the job: the engine's MPI rank; for DDP, torchrun's variables for this run."""
    from mpi4py import MPI

    from ..engine import train

    env: dict[str, str] = {}
    if rendezvous is not None:
        world = MPI.COMM_WORLD
        node = world.Split_type(MPI.COMM_TYPE_SHARED)
        env = {"RANK": str(world.Get_rank()), "WORLD_SIZE": str(world.Get_size()),
               "LOCAL_RANK": str(node.Get_rank()), "LOCAL_WORLD_SIZE": str(node.Get_size()),
               "MASTER_ADDR": rendezvous[0], "MASTER_PORT": str(rendezvous[1])}
        node.Free()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return train(cfg)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        sys.stdout.flush()


# -- notebooks ------------------------------------------------------------------------------

def one_line_errors() -> None:
    """In a notebook, show a GuideError as one line (``error: ...``), without a traceback,
    like the guide's commands do; every other exception keeps its traceback."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return

    def show(shell, etype, value, tb, tb_offset=None):
        print(f"error: {value}", file=sys.stderr)

    shell.set_custom_exc((GuideError,), show)


def print_plan(cfg: TrainConfig, *, n: int, engines: str, site: str | None = None, profile: str = "smoke",
               controller_ip: str | None = None, walltime: str = "01:00:00") -> None:
    """What ``EngineCluster(n, engines=...).train(cfg)`` would do, started nowhere: the
    engines, the controller address, the training, and the batch script Slurm engines get."""
    from ..studies.experiments import PlannedRun, describe

    settings = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "extra"}
    ip = controller_address(controller_ip)
    where = "mpiexec on this node" if engines == "mpi" else "a Slurm job from the site profile"
    # At most 100 characters a line: what a notebook's output column (and the book's) shows.
    print(textwrap.fill(f'interactive: EngineCluster(n={n}, engines="{engines}"): {n} ipyparallel engines '
                        f"({where}), controller on {ip}", 100, subsequent_indent="    "))
    print(textwrap.fill(f"{describe(PlannedRun('interactive', n, settings), profile)}; --dist {cfg.dist}", 100,
                        initial_indent="    ", subsequent_indent="        "))
    if engines == "slurm" or site:
        from .sites import engines_batch_script, guide_root, read_site

        s = read_site(site)
        script = engines_batch_script(s, n, walltime=walltime, log="logs/ipengine-<cluster>-%j.out",
                                      controller=("<host>", "<port>"))  # type: ignore[arg-type]
        script = script.format(cluster_id="<cluster>", program_and_args="python -m ipyparallel.engine --mpi ...")
        shown = Path(s.file).resolve()
        with contextlib.suppress(ValueError):  # a profile of the repository: its path in it
            shown = shown.relative_to(guide_root().resolve())
        print(f"    the engines' batch script (site {s.name}, {shown}; <repo>: this repository):")
        script = script.replace(str(guide_root().resolve()), "<repo>")
        print("\n".join("  | " + line for line in script.splitlines()))
