"""``python -m guide_utils COMMAND``: the guide's command-line entry point.

Training:
  train         the PyTorch engine (also: python -m guide_utils.train)
  train-tf      the TensorFlow/Keras door (also: python -m guide_utils.train_tf)
Studies:
  verify        does this machine reproduce the guide? train the sweep's points with new seeds, check the conclusions
On the cluster:
  doctor        what this machine, stack and Slurm job look like, and what will hurt
                (--tasks FILE: judge the task-probe lines of a job's tasks)
  image         the guide's OCI image with podman: build (or reuse), smoke (one epoch inside), save
                (a docker-archive, for apptainer build)
  inventory     the playbook's hosts.yml from a provisioner's machines (tofu output -json)
  task-probe    what one task of a job sees (CPUs, GPUs) as a JSON line, for doctor --tasks
  sync-check    do N processes (Horovod or DDP) really end with the same weights?
  check-script  does your own training script distribute correctly? two CPU workers, before the queue
  rendezvous    HOST:PORT of this Slurm job's rendezvous (first node, port from the job id)
  pack-dataset  write a real image dataset as a tar archive (the ImageFolder layout)
  prepare-imagenet  the official ILSVRC2012 downloads as that one archive, for the jobs to stage
Performance:
  comms         allreduce time, algbw and busbw over message sizes, and the gradient knobs
  plan          how many nodes and which batch: the data-parallel step model, before you submit
  links         emulated hosts joined by links of a given rate (namespaces, tc): the model measured

Every command takes --help, and --debug to show a traceback instead of a one-line error.
"""

from __future__ import annotations

import functools
import importlib
import sys

from .core.errors import EXIT_USAGE

COMMANDS = {  # name: (module, function), grouped as --help lists them
    # training
    "train": ("guide_utils.train", "main"),
    "train-tf": ("guide_utils.train_tf", "main"),
    # studies: each module of guide_utils.studies that declares a Study is one too (commands())
    "verify": ("guide_utils.studies.verify", "main"),
    # on the cluster
    "doctor": ("guide_utils.cluster.doctor.cli", "main"),
    "image": ("guide_utils.cluster.image", "main"),
    "inventory": ("guide_utils.cluster.inventory", "main"),
    "task-probe": ("guide_utils.cluster.doctor.tasks", "main"),
    "sync-check": ("guide_utils.cluster.sync_check", "main"),
    "check-script": ("guide_utils.cluster.script_check.check", "main"),
    "rendezvous": ("guide_utils.runtime.slurm", "rendezvous_main"),
    "pack-dataset": ("guide_utils.cluster.pack", "main"),
    "prepare-imagenet": ("guide_utils.data.imagenet", "main"),
    # performance
    "comms": ("guide_utils.perf.comms.cli", "main"),
    "plan": ("guide_utils.perf.planner", "main"),
    "links": ("guide_utils.perf.links.cli", "main"),
}


def commands() -> dict[str, tuple[str, str]]:
    """Every command: the table above and the studies, which ``studies.registry`` finds (each
    module of ``guide_utils.studies`` that declares a ``Study``) only when asked: the other
    commands start without importing every study."""
    from .studies import registry

    return {**COMMANDS, **registry.commands()}


def usage() -> str:
    """What --help prints: this module's text, the studies' lines (``studies.registry``) under "Studies:"."""
    from .studies import registry

    head, tail = __doc__.strip().split("Studies:\n", 1)
    return "\n".join([f"{head}Studies:", *registry.help_lines(), tail])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else EXIT_USAGE
    name, rest = argv[0], argv[1:]
    table = COMMANDS if name in COMMANDS else commands()
    if name not in table:
        print(f"guide_utils: error: unknown command {name!r}; choose from {', '.join(table)} "
              "(see python -m guide_utils --help)", file=sys.stderr)
        return EXIT_USAGE
    module, func = table[name]
    return functools.reduce(getattr, func.split("."), importlib.import_module(module))(rest)


if __name__ == "__main__":
    sys.exit(main())
