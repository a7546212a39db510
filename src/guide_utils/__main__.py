"""``python -m guide_utils COMMAND``: the guide's command-line entry point.

Training:
  train         the PyTorch engine (also: python -m guide_utils.train)
  train-tf      the TensorFlow/Keras door (also: python -m guide_utils.train_tf)
Studies:
  experiments   the thesis's nine experiments: list, run, --dry-run
  sweep         the quality sweep over the scaling factor k
  large-batch   past the linear rule: sqrt scaling, LARS and LAMB up to a global batch of 8192
  verify        does this machine reproduce the guide? retrain recorded points, check the conclusions
On the cluster:
  doctor        what this machine, stack and Slurm job look like, and what will hurt
                (--tasks FILE: judge the task-probe lines of a job's tasks)
  image         the guide's OCI image with podman: build (or reuse), smoke (one epoch inside), save
                (a docker-archive, for apptainer build)
  inventory     the playbook's hosts.yml from a provisioner's machines (tofu output -json)
  task-probe    what one task of a job sees (CPUs, GPUs) as a JSON line, for doctor --tasks
  sync-check    do N processes (Horovod or DDP) really end with the same weights?
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

import importlib
import sys

from .core.errors import EXIT_USAGE

COMMANDS = {  # name: (module, function), grouped as --help lists them
    # training
    "train": ("guide_utils.train", "main"),
    "train-tf": ("guide_utils.train_tf", "main"),
    # studies
    "experiments": ("guide_utils.studies.experiments", "main"),
    "sweep": ("guide_utils.studies.sweep", "main"),
    "large-batch": ("guide_utils.studies.large_batch", "main"),
    "verify": ("guide_utils.studies.verify", "main"),
    # on the cluster
    "doctor": ("guide_utils.cluster.doctor", "main"),
    "image": ("guide_utils.cluster.image", "main"),
    "inventory": ("guide_utils.cluster.inventory", "main"),
    "task-probe": ("guide_utils.cluster.doctor_tasks", "main"),
    "sync-check": ("guide_utils.cluster.sync_check", "main"),
    "rendezvous": ("guide_utils.runtime.slurm", "rendezvous_main"),
    "pack-dataset": ("guide_utils.cluster.pack", "main"),
    "prepare-imagenet": ("guide_utils.data.imagenet", "main"),
    # performance
    "comms": ("guide_utils.perf.comms", "main"),
    "plan": ("guide_utils.perf.planner", "main"),
    "links": ("guide_utils.perf.links_cli", "main"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else EXIT_USAGE
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"guide_utils: error: unknown command {name!r}; choose from {', '.join(COMMANDS)} "
              "(see python -m guide_utils --help)", file=sys.stderr)
        return EXIT_USAGE
    module, func = COMMANDS[name]
    return getattr(importlib.import_module(module), func)(rest)


if __name__ == "__main__":
    sys.exit(main())
