"""``python -m guide_utils.train``: the training engine from the command line.

Laptop (CPU, seconds):
    python -m guide_utils.train --profile smoke
    horovodrun -np 2 --gloo python -m guide_utils.train --profile smoke --dist horovod

Cluster (one task per GPU, inside an sbatch script):
    srun python -m guide_utils.train --data $TMPDIR/ilsvrc2012 --dist horovod \\
        --per-worker-batch 128 --warmup gradual --warmup-epochs 5 --checkpoint-dir ckpt/

Every flag defaults to the chosen profile's value (``full``: the thesis's ResNet-50 /
ImageNet / 90-epoch setting; ``smoke``: MNIST-1D and a small CNN). Exit status: 0 done,
2 bad input (one line says what to fix), 75 stopped by SIGTERM/SIGUSR1 after saving a
checkpoint (requeue and rerun the same command to resume).
"""

from __future__ import annotations

import sys

from .core import flags
from .core.cli import ArgumentParser, one_line_errors
from .engine import signals

PROG = flags.PROG


def build_parser() -> ArgumentParser:
    """``--help`` shows the examples above; the flags are :mod:`guide_utils.core.flags`."""
    examples = __doc__.split("\n\n", 1)[1].rsplit("\n\nEvery flag", 1)[0]
    return flags.build_parser(PROG, "The guide's training engine: the same loop on a laptop and on a GPU cluster.\n\n"
                              + examples)


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    cfg = flags.config_from_argv(argv, build_parser())
    if cfg.checkpoint_dir:  # without somewhere to save, SIGTERM and SIGUSR1 keep meaning "stop now"
        signals.catch_early()  # before the seconds of importing torch

    from .engine import EXIT_REQUEUE, train

    result = train(cfg)
    return EXIT_REQUEUE if result.preempted else 0


if __name__ == "__main__":
    sys.exit(main())
