"""What ``check-script`` loads into every worker before the reader's script: hooks on PyTorch
that record what the script does, rank by rank; then the script itself, unchanged.

    python -m guide_utils.cluster.script_check.probe SCRIPT [ARGS...]

The check starts this under the launcher in place of the script. It imports nothing of the
guide but its own package (a worker pays for torch only) and writes, in ``$GUIDE_CHECK_DIR``,
one JSON line per event to ``<run>.rank<R>.jsonl`` (flushed at once: a rank that hangs or
dies leaves what it did), the rank's output to ``<run>.rank<R>.log``, and its models'
weights at its first training pass and at its end. It watches, from outside the script:

* forward passes of a module with parameters called at the top level (PyTorch's global
  module hooks): in training mode with gradients on, a *training* pass (the weights' digest,
  the batch's sample indices or the input's digest, the random state), otherwise an
  evaluation pass, only counted;
* optimizer steps (PyTorch's global step hooks): the learning rates, the optimizer's state,
  whether Horovod wraps it; gradient clipping while Horovod still averages;
* DataLoader epochs and the sample indices of every batch; ``torch.save``/``torch.load``
  (a save outside the run's folder is refused: the check never writes a reader's files);
  broadcasts (the DDP wrapper's, ``hvd.broadcast_parameters``, ``dist.broadcast``); the
  script's parsed flags.

The *position* is the number of optimizer steps taken (or of training passes, for a script
that updates its weights by hand), counted from the start of an unbroken run: a restart
finds its own by looking up its first weights among the unbroken run's. The check steers a
run by three settings: ``GUIDE_CHECK_STEPS`` ends it at that position, ``GUIDE_CHECK_SIGNAL_AT``
sends SIGUSR1 (Slurm's warning, as the batch scripts pass it on) to one rank right after
that step, and ``GUIDE_CHECK_TABLE`` names the unbroken run to look positions up in.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import runpy
import signal
import sys
import time
import traceback
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.modules import module as nn_module
from torch.nn.parallel import DistributedDataParallel
from torch.optim import optimizer as optim_module
from torch.utils.data import dataloader

from .hooks import AfterImport, wrap

RANK_VARIABLES = (("RANK", "WORLD_SIZE"), ("HOROVOD_RANK", "HOROVOD_SIZE"),
                  ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                  ("SLURM_PROCID", "SLURM_NTASKS"))
# Collectives a script calls itself (a metric summed over the ranks, a flag they agree on):
# the end-of-epoch work a resumed run must not skip. Not the averaging of the gradients,
# which DDP does in C++ and Horovod's optimizer through names of its own.
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "reduce", "gather",
               "reduce_scatter", "all_to_all")
HOROVOD_COLLECTIVES = ("allreduce", "allreduce_", "grouped_allreduce", "allgather", "allgather_object",
                       "alltoall")
_SAVE, _LOAD = torch.save, torch.load  # the originals, for the probe's own files


def digest(chunks) -> str:
    h = hashlib.blake2b(digest_size=8)
    for chunk in chunks:
        h.update(chunk if isinstance(chunk, bytes) else repr(chunk).encode())
    return h.hexdigest()


def tensor_bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def weights(module) -> dict:
    """A module's parameters and buffers by name, the DDP wrapper's ``module.`` taken off."""
    return {part: {name.removeprefix("module."): t.detach().cpu().clone() for name, t in named}
            for part, named in (("params", module.named_parameters()), ("buffers", module.named_buffers()))}


def first_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return next((t for t in map(first_tensor, items) if t is not None), None)


def rng_digests() -> list[str | None]:
    """Digests of torch's, numpy's (if loaded) and Python's random state, in that order."""
    import random

    numpy = sys.modules.get("numpy")
    state = numpy.random.get_state() if numpy is not None else None
    return [digest([tensor_bytes(torch.get_rng_state())]),
            digest([state[1].tobytes(), state[2:]]) if state is not None else None, digest([random.getstate()])]


def is_horovod(optimizer) -> bool:
    """Whether Horovod wraps ``optimizer``: its class is a copy of the wrapped one's with
    Horovod's methods in it (not a subclass of Horovod's), so ask for what they leave."""
    return hasattr(optimizer, "_handles") and callable(getattr(optimizer, "skip_synchronize", None))


def module_keys(obj, depth: int = 2) -> bool:
    """Whether a saved object holds a state dict of the DDP wrapper (keys ``module.*``)."""
    if not isinstance(obj, dict) or depth == 0:
        return False
    return any(isinstance(k, str) and k.startswith("module.") for k in obj) or \
        any(module_keys(v, depth - 1) for v in obj.values())


def simple(value):
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
        return list(value)
    return repr(value)[:80]


class Probe:
    """One worker's observer: its counters, its event file, and the hooks that feed them."""

    def __init__(self, env=os.environ):
        self.rank, self.size = next(((int(env[r]), int(env[s])) for r, s in RANK_VARIABLES if r in env), (0, 1))
        self.folder = Path(env["GUIDE_CHECK_DIR"])
        self.prefix = self.folder / f"{env['GUIDE_CHECK_RUN']}.rank{self.rank}"
        self.home = Path.cwd().resolve()
        self.cap = int(env.get("GUIDE_CHECK_STEPS", "0")) or None
        self.signal_at = int(env["GUIDE_CHECK_SIGNAL_AT"]) if env.get("GUIDE_CHECK_SIGNAL_AT") else None
        self.signal_rank = int(env.get("GUIDE_CHECK_SIGNAL_RANK", "1"))
        self.table = env.get("GUIDE_CHECK_TABLE")
        self.fallback = int(env.get("GUIDE_CHECK_BASE", "0"))
        self.events = open(f"{self.prefix}.jsonl", "w", buffering=1)
        self.models: list = []  # weak references to the modules trained at the top level
        self.ddp_inner: weakref.WeakSet = weakref.WeakSet()  # the modules a DDP wrapper holds
        self.optimizers: weakref.WeakSet = weakref.WeakSet()
        self.base: int | None = None  # the position of this run's start in the unbroken run
        self.updates = self.trained = self.evals = self.collectives = self.broadcasts = self.changes = 0
        self.last: str | None = None  # the first model's weights at its last training pass
        self.forward_depth = self.step_depth = 0
        self.batch = None  # (loader, sample indices) of the batch a loader returned last
        self.loaders: dict[int, int] = {}
        self.ended = False

    # -- the record --------------------------------------------------------------------------

    def emit(self, kind: str, **fields) -> None:
        self.events.write(json.dumps({"e": kind, "t": round(time.time(), 3), **fields}) + "\n")

    def position(self) -> int:
        """Steps taken in this process: optimizer steps, or, where the weights are updated by
        hand, the changes of the first model's weights from one training pass to the next."""
        return self.updates or self.changes

    def absolute(self) -> int:
        return (self.base if self.base is not None else self.fallback) + self.position()

    def find_base(self, first: str) -> int:
        """Where the unbroken run had the weights this run starts from (its first training pass)."""
        if not self.table:
            return 0
        for line in Path(f"{self.table}.rank{self.rank}.jsonl").read_text().splitlines():
            event = json.loads(line)
            if event["e"] == "fwd" and event["w"] == first:
                return event["pos"]
        return self.fallback

    def finish(self, how: str, code=0, error: str | None = None, where: str | None = None) -> None:
        """The run's last record: how it ended, and every trained model's weights."""
        if self.ended:
            return
        self.ended = True
        models = [m for m in (ref() for ref in self.models) if m is not None]
        _SAVE([weights(m) for m in models], f"{self.prefix}.final.pt")
        w = digest(tensor_bytes(p) for p in models[0].parameters()) if models else None
        self.changes += self.last is not None and w != self.last  # an update by hand after the last pass
        self.emit("end", how=how, code=code, error=error, where=where, pos=self.absolute(), w=w,
                  updates=self.updates, trained=self.trained, evals=self.evals, collectives=self.collectives)
        self.events.flush()

    # -- forward passes ------------------------------------------------------------------------

    def before_forward(self, module, args) -> None:
        self.forward_depth += 1
        if self.forward_depth != 1 or next(module.parameters(), None) is None:
            return  # inside another module's forward, or a parameter-free one (a loss)
        if not (module.training and torch.is_grad_enabled()):
            self.evals += 1
            return
        found = [i for i, ref in enumerate(self.models) if ref() is module]
        if not found:
            self.models.append(weakref.ref(module))
        index = found[0] if found else len(self.models) - 1
        w = digest(tensor_bytes(p) for p in module.parameters())
        if index == 0:
            self.changes += self.last is not None and w != self.last
            self.last = w
        if self.base is None:
            self.base = self.find_base(w)
            _SAVE([weights(module)], f"{self.prefix}.first.pt")
            self.emit("begin", base=self.base, broadcasts=self.broadcasts, model=type(module).__name__)
        if self.cap is not None and self.absolute() >= self.cap:
            self.finish("cap")
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(0)
        if self.signal_at is not None and not self.updates and self.absolute() == self.signal_at - 1:
            self.send_signal()  # updated by hand, unseen: warned during the step that reaches signal_at
        loader, indices = self.batch or (None, None)
        x = first_tensor(args)
        self.emit("fwd", i=self.trained, pos=self.absolute(), m=index, w=w, rng=rng_digests(),
                  x=digest([tensor_bytes(x)]) if x is not None else None, loader=loader, idx=indices,
                  evals=self.evals, collectives=self.collectives, bare=module in self.ddp_inner, lr=self.rates())
        self.trained += 1
        self.evals = self.collectives = 0
        self.batch = None

    def after_forward(self, module, args, output) -> None:
        self.forward_depth -= 1

    def rates(self) -> list[float]:
        return [group["lr"] for o in self.optimizers for group in o.param_groups if "lr" in group]

    # -- optimizer steps -----------------------------------------------------------------------

    def before_step(self, optimizer, args, kwargs) -> None:
        self.step_depth += 1
        if self.step_depth > 1:
            return  # Horovod's step calls the wrapped optimizer's
        state = [tensor_bytes(v) if isinstance(v, torch.Tensor) else v
                 for group in optimizer.param_groups for p in group["params"]
                 for _, v in sorted(optimizer.state.get(p, {}).items())]
        self.emit("step", n=self.updates, pos=self.absolute(), lr=[g.get("lr") for g in optimizer.param_groups],
                  opt=type(optimizer).__name__, horovod=is_horovod(optimizer), state=digest(state))

    def after_step(self, optimizer, args, kwargs) -> None:
        self.step_depth -= 1
        if self.step_depth:
            return
        self.updates += 1
        if self.signal_at is not None and self.absolute() == self.signal_at:
            self.send_signal()

    def send_signal(self) -> None:
        if self.rank == self.signal_rank:
            self.emit("signal", pos=self.signal_at)
            os.kill(os.getpid(), signal.SIGUSR1)

    # -- the hooks -----------------------------------------------------------------------------

    def install(self) -> None:
        nn_module.register_module_forward_pre_hook(self.before_forward)
        nn_module.register_module_forward_hook(self.after_forward, always_call=True)
        optim_module.register_optimizer_step_pre_hook(self.before_step)
        optim_module.register_optimizer_step_post_hook(self.after_step)
        wrap(optim_module.Optimizer, "__init__", after=lambda o, *a, **k: self.optimizers.add(o))
        wrap(DistributedDataParallel, "__init__", after=lambda m, *a, **k: self.wrapped(m))
        for holder in (dist, dist.distributed_c10d):
            wrap(holder, "broadcast", before=lambda *a, **k: self.broadcast())
            for name in COLLECTIVES:
                if hasattr(holder, name):
                    wrap(holder, name, before=lambda *a, **k: self.collective())
        for name in ("clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_"):
            for holder in (torch.nn.utils, torch.nn.utils.clip_grad):
                if hasattr(holder, name):
                    wrap(holder, name, before=lambda *a, **k: self.clipping())
        for holder in (torch, torch.serialization):
            wrap(holder, "save", before=self.saving)
            wrap(holder, "load", before=lambda f=None, *a, **k: self.emit("load", path=self.relative(f)))
        wrap(dataloader.DataLoader, "__iter__", result=self.epoch)
        wrap(dataloader._BaseDataLoaderIter, "_next_index", result=self.indices)
        wrap(dataloader._BaseDataLoaderIter, "__next__", result=self.batch_out)
        wrap(dataloader._BaseDataLoaderIter, "_reset", before=lambda it, *a, **k: vars(it).pop("_fifo", None))
        wrap(argparse.ArgumentParser, "parse_known_args", result=self.parsed)
        sys.meta_path.insert(0, AfterImport("horovod.torch", self.horovod))

    def wrapped(self, ddp) -> None:
        self.ddp_inner.add(ddp.module)
        self.broadcasts += 1
        self.emit("ddp", model=type(ddp.module).__name__)

    def broadcast(self) -> None:
        self.broadcasts += 1

    def collective(self) -> None:
        if not self.step_depth:  # not Horovod's own averaging inside a step
            self.collectives += 1

    def horovod(self, hvd) -> None:
        self.emit("horovod")
        for name in ("broadcast_parameters", "broadcast_", "broadcast", "broadcast_object"):
            if hasattr(hvd, name):
                wrap(hvd, name, before=lambda *a, **k: self.broadcast())
        for name in HOROVOD_COLLECTIVES:
            if hasattr(hvd, name):
                wrap(hvd, name, before=lambda *a, **k: self.collective())

    def clipping(self) -> None:
        pending = sum(len(o._handles) for o in self.optimizers if is_horovod(o))
        if pending:
            self.emit("clip", pos=self.absolute(), pending=pending)

    def relative(self, f) -> str | None:
        if not isinstance(f, (str, os.PathLike)):
            return None
        path = Path(f).resolve()
        return str(path.relative_to(self.home)) if path.is_relative_to(self.home) else str(path)

    def saving(self, obj=None, f=None, *args, **kwargs) -> None:
        where = self.relative(f)
        self.emit("save", path=where, pos=self.absolute(), module_keys=module_keys(obj))
        if where is not None and Path(where).is_absolute() and where != os.devnull:
            raise RuntimeError(f"check-script refuses to let the script write {where}, outside the folder "
                               "each run starts in; give the checkpoint's path relative to it")

    def epoch(self, it, loader, *args, **kwargs):
        number = self.loaders.setdefault(id(loader), len(self.loaders))
        sampler = getattr(loader, "sampler", None)
        self.emit("pass", loader=number, sampler=type(sampler).__name__, epoch=getattr(sampler, "epoch", None),
                  pos=self.absolute())
        it._guide_loader = number
        return it

    def indices(self, index, it, *args, **kwargs):
        vars(it).setdefault("_fifo", []).append(index)
        return index

    def batch_out(self, batch, it, *args, **kwargs):
        fifo = vars(it).get("_fifo") or [None]
        index = fifo.pop(0)
        index = index if isinstance(index, list) else [index]
        # An iterable dataset has no indices (None): its batches are told apart by their inputs
        known = [i if isinstance(i, int) else digest([repr(i)]) for i in index if i is not None]
        self.batch = (getattr(it, "_guide_loader", None), known or None)
        return batch

    def parsed(self, result, parser, *args, **kwargs):
        namespace = result[0] if isinstance(result, tuple) else result
        self.emit("args", values={k: simple(v) for k, v in vars(namespace).items()})
        return result


def run(script: str, args: list[str]) -> None:
    """Run ``script`` as ``python SCRIPT ARGS`` would, with the probe's hooks in place."""
    probe = Probe()
    log = os.open(f"{probe.prefix}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1), os.dup2(log, 2)
    probe.emit("start", rank=probe.rank, size=probe.size, pid=os.getpid(), threads=torch.get_num_threads())
    probe.install()
    sys.argv = [script, *args]
    sys.path[0] = str(Path(script).resolve().parent)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        probe.finish("exit", code=code)
        raise
    except BaseException as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        mine = [f for f in frames if Path(f.filename).resolve() == Path(script).resolve()] or frames
        probe.finish("exit", code=1, error=f"{type(exc).__name__}: {exc}".strip()[:2000],
                     where=f"{Path(mine[-1].filename).name}:{mine[-1].lineno}")
        raise
    probe.finish("exit", code=0)


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2:])
