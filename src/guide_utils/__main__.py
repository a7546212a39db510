"""``python -m guide_utils COMMAND``: the guide's command-line entry point.

Commands:
  doctor    what this machine, this software stack and this Slurm job look like,
            and what in them will hurt distributed training
  sync-check  do N processes (Horovod or DDP) really end with the same weights?
  rendezvous  HOST:PORT of this Slurm job's rendezvous (first node, port from the job id)
  pack-dataset  write a real image dataset as a tar archive (the ImageFolder layout),
            for the sbatch examples' stage-to-local-disk step
"""

from __future__ import annotations

import sys

from .cli import EXIT_USAGE

COMMANDS = {
    "doctor": ("guide_utils.doctor", "main"),
    "sync-check": ("guide_utils.sync_check", "main"),
    "pack-dataset": ("guide_utils.pack", "main"),
    "rendezvous": ("guide_utils.slurm", "rendezvous_main"),
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
    return getattr(__import__(module, fromlist=[func]), func)(rest)


if __name__ == "__main__":
    sys.exit(main())
