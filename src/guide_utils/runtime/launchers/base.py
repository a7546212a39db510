"""What every launcher environment answers, and the answers most of them share.

A subclass names its launcher, the variables in which that launcher tells a process its
rank, world size, local rank, local size and node rank (the first one set wins; read by
:func:`..variables.read_int`, the one parser), and how it is told apart from the others
(:meth:`Launcher.detect`, checked in ``priority`` order: a lower number first; the rules
for choosing it are CONTRIBUTING.md's). Defining the subclass registers it;
``runtime.launchers`` imports every module of its package.

No scheduler lives here. What the batch system says of the job (its id, nodes, submission
directory, a task's CPUs) comes from the scheduler object ``runtime.schedulers.detect``
chooses by the environment (Slurm, LSF, PBS), so a launcher overrides only what it says
differently from its scheduler (jsrun: the first LSF host runs no task).
"""

from __future__ import annotations

import os
from typing import ClassVar, Mapping

from ...core.errors import GuideError
from .. import rendezvous, schedulers
from ..cpus import affinity
from ..gpus import device_index, usable_devices
from ..variables import read_int

BACKENDS = ("horovod", "ddp", "mwms")  # the --dist values that need a launcher


class Launcher:
    """The environment a launcher gave this process (``env``, default ``os.environ``)."""

    name: ClassVar[str] = ""  # as a reader types it; "" for a base class
    priority: ClassVar[int] = 100
    unit: ClassVar[str] = "processes"  # what it starts, in its own documentation's word
    family: ClassVar[str] = ""  # what runtime.launch.started_by reports ("" : the name)
    backends: ClassVar[tuple[str, ...]] = ()  # the --dist values it can start, the usual one first
    RANK: ClassVar[tuple[str, ...]] = ()
    SIZE: ClassVar[tuple[str, ...]] = ()
    LOCAL_RANK: ClassVar[tuple[str, ...]] = ()
    LOCAL_SIZE: ClassVar[tuple[str, ...]] = ()
    NODE_RANK: ClassVar[tuple[str, ...]] = ()
    ADDRESS: ClassVar[tuple[str, ...]] = ()  # where the launcher put its own rendezvous, if it did
    PORT: ClassVar[tuple[str, ...]] = ()
    # Whether it binds each rank to CPUs of its own (srun's tasks, jsrun's resource sets); the
    # others start all of a node's ranks on one CPU set, which they share.
    binds_each_rank: ClassVar[bool] = False
    # The scheduler (``runtime.schedulers``: "slurm", "lsf") whose jobs alone it runs in; "": any.
    scheduler_name: ClassVar[str] = ""
    local: ClassVar[bool] = False  # whether ``runtime.launch.command`` starts it on this machine
    example: ClassVar[str] = ""  # a command line that starts a run with it, for messages
    registry: ClassVar[list[type["Launcher"]]] = []

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            if any(c.name == cls.name for c in Launcher.registry):
                raise TypeError(f"two launchers named {cls.name!r}")
            Launcher.registry.append(cls)
            Launcher.registry.sort(key=lambda c: (c.priority, c.name))

    def __init__(self, env: Mapping[str, str] | None = None):
        # A copy: what the launcher said, before a runtime's init adds its own variables.
        self.env = dict(os.environ if env is None else env)
        self.scheduler = schedulers.detect(self.env)  # the job it runs in; None outside one

    @property
    def job(self):
        """The scheduler's own description of the job, where it has one (under Slurm a
        ``runtime.slurm.SlurmJob``), else None."""
        return self.scheduler.job if self.scheduler is not None else None

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        """Whether this launcher started the process whose environment is ``env``."""
        raise NotImplementedError

    @classmethod
    def starts(cls, dist: str) -> str | None:
        """How a reader starts a ``--dist`` run with this launcher, for the message when no
        launcher started one (None: it cannot, or it is started by another launcher)."""
        return cls.name if isinstance(cls.backends, tuple) and dist in cls.backends else None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank {self.rank} of {self.world_size}>"

    # -- ranks ------------------------------------------------------------------------------
    def _read(self, names: tuple[str, ...]) -> int | None:
        return read_int(self.env, *names)

    @property
    def rank(self) -> int:
        return self._read(self.RANK) or 0

    @property
    def world_size(self) -> int:
        return self._read(self.SIZE) or 1

    @property
    def local_rank(self) -> int:
        return self._read(self.LOCAL_RANK) or 0

    @property
    def local_size(self) -> int:
        """Processes of this job on this node (1 when the launcher does not say)."""
        return self._read(self.LOCAL_SIZE) or 1

    @property
    def node_rank(self) -> int:
        """This node's index among the job's nodes."""
        node = self._read(self.NODE_RANK)
        return node if node is not None else self.rank // max(self.local_size, 1)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # -- rendezvous -------------------------------------------------------------------------
    @property
    def main_address(self) -> str | None:
        """The host of rank 0, where a rendezvous server listens (None: cannot be told)."""
        given = next((self.env[n] for n in self.ADDRESS if self.env.get(n)), None)
        if given:
            return given
        nodes = self.scheduler.task_nodes if self.scheduler is not None else []
        return nodes[0] if nodes else None

    @property
    def job_id(self) -> int | None:
        """The scheduler's job id (None outside a batch job)."""
        return self.scheduler.job_id if self.scheduler is not None else None

    def rendezvous_key(self) -> str:
        """Names this run of the job: the announcement file's name (runtime.rendezvous)."""
        return self.scheduler.rendezvous_key() if self.scheduler is not None else "local"

    def main_port(self) -> int | None:
        """The port of the rendezvous: the launcher's own, else the job id's (checked by rank 0
        and announced to the others: ``runtime.rendezvous.agree``). None outside a batch job."""
        given = self._read(self.PORT) if self.PORT else None
        if given is None:
            given = read_int(self.env, "MASTER_PORT")  # the batch script's or the user's choice
        if given is not None:
            return given
        if self.job_id is None:
            return None
        return rendezvous.agree(self.announce_file(), rendezvous.derived_port(self.job_id), self.is_main)

    def announce_file(self):
        """Where the main rank announces the port it chose (``runtime.rendezvous``)."""
        where = self.scheduler.SUBMIT_DIR if self.scheduler is not None else ()
        return rendezvous.announce_file(self.env, where, self.rendezvous_key())

    def rendezvous_done(self) -> None:
        """Every rank has joined: the main rank removes its announcement (if it made one)."""
        if self.is_main and self.job_id is not None:
            rendezvous.release(self.announce_file())

    def torch_env(self) -> dict[str, str]:
        """The variables torch.distributed's ``env://`` init reads, for those the launcher
        did not set itself (an empty dict when it set them all)."""
        wanted = {"RANK": lambda: self.rank, "WORLD_SIZE": lambda: self.world_size,
                  "LOCAL_RANK": lambda: self.local_rank, "LOCAL_WORLD_SIZE": lambda: self.local_size,
                  "MASTER_ADDR": lambda: self.main_address, "MASTER_PORT": self.main_port}
        out = {}
        for name, answer in wanted.items():  # only what is missing: main_port may wait for rank 0
            if not self.env.get(name):
                value = answer()
                if value is None:
                    raise GuideError(f"{self.name} does not say {name} and it cannot be derived; export "
                                     f"{name} before starting the job")
                out[name] = str(value)
        return out

    def export_torch_env(self) -> None:
        """Put :meth:`torch_env` into ``os.environ`` (where torch and the engine read it)."""
        os.environ.update({k: v for k, v in self.torch_env().items() if k not in os.environ})

    # -- the node's share -------------------------------------------------------------------
    def gpus(self) -> list[str] | None:
        """The GPUs this process may use (``runtime.gpus.usable_devices``: its device list, else
        the step's count on this node); None when neither says."""
        return usable_devices(self.env)

    def gpu(self) -> str | None:
        """The GPU of ``gpus()`` this rank takes (``runtime.gpus.device_index``), or None."""
        visible = self.gpus()
        return visible[device_index(self.local_rank, len(visible))] if visible else None

    def cpus(self) -> list[int]:
        """The CPUs this process may run on (:func:`affinity`)."""
        return affinity()

    def cpus_asked(self) -> int | float | None:
        """The CPUs the job asked for this process (the scheduler's, Slurm's --cpus-per-task),
        None if unknown."""
        return self.scheduler.cpus_per_task if self.scheduler is not None else None

    def cpu_share(self) -> int:
        """The CPUs this rank can count on, for itself and its loader workers: the CPUs it may
        run on, divided among the node's ranks unless the launcher bound it to its own, and
        never more than the job asked for it. (Counting the whole set for every rank that
        shares it would start, under torchrun on an 8-GPU node, 8 ranks x 15 loader workers.)"""
        cpus = len(self.cpus())
        share = cpus if self.binds_each_rank else cpus // max(1, self.local_size)
        asked = self.cpus_asked()
        return max(1, min(share, int(asked)) if asked else share)

    # -- what it can start ------------------------------------------------------------------
    def can_start(self, dist: str) -> bool:
        return dist in self.backends

    def not_startable(self, dist: str) -> str | None:
        """Why this launcher cannot start ``dist`` where that needs more than the general
        message (``runtime.launchers.require``), else None."""
        return None

    def prefers(self, dist: str) -> bool:
        """Whether ``dist`` is the usual backend under this launcher."""
        return bool(self.backends) and self.backends[0] == dist

    def started_by(self) -> str:
        return self.family or self.name

    def check_world(self, seen: int, runtime: str) -> None:
        """Raise a one-line error when ``runtime`` sees another world than the launcher made
        (where the launcher says how many it made)."""
        if self._read(self.SIZE) is not None and seen != self.world_size:
            raise GuideError(f"{self.name} started {self.world_size} {self.unit} but {runtime} sees {seen}: "
                             f"{self.world_mismatch_hint()}")

    def world_mismatch_hint(self) -> str:
        return "the runtime and the launcher do not speak the same process manager"
