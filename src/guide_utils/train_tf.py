"""``python -m guide_utils.train_tf``: the TensorFlow/Keras door, with the PyTorch engine's
flags and run records.

Laptop (CPU, seconds):
    python -m guide_utils.train_tf --profile smoke
    horovodrun -np 2 --gloo python -m guide_utils.train_tf --profile smoke --dist horovod

Cluster (one task per GPU, inside an sbatch script):
    srun --mpi=pmix python -m guide_utils.train_tf --data $TMPDIR/ilsvrc2012 --dist horovod --warmup gradual
    srun python -m guide_utils.train_tf --dist mwms ...     # TensorFlow's MultiWorkerMirroredStrategy

Flags that only the PyTorch engine has (--amp, --channels-last, --compile, --fp16-allreduce,
--accumulate-steps) are refused with one line. --dist takes none, horovod or mwms. Exit status: 0 done, 2 bad
input (one line says what to fix), 75 stopped by SIGTERM/SIGUSR1 with --checkpoint-dir
(requeue and rerun the same command to resume). Checkpoints are saved at epoch ends only:
Keras's fit cannot start part-way through an epoch, so a stop mid-epoch redoes that epoch.
"""

from __future__ import annotations

import os
import sys

from .core import flags
from .core.cli import ArgumentParser, one_line_errors
from .engine import signals

PROG = "python -m guide_utils.train_tf"


def build_parser() -> ArgumentParser:
    p = flags.build_parser(PROG, "The guide's TensorFlow door: Keras with Horovod or MultiWorkerMirroredStrategy, "
                                 "same flags and records as python -m guide_utils.train.\n\n"
                                 + __doc__.split("\n\n", 1)[1].rsplit("\n\nFlags that", 1)[0])
    p.epilog = ("Exit status: 0 done; 2 bad input; 75 stopped by SIGTERM/SIGUSR1 (resume by rerunning with the "
                "same --checkpoint-dir).")
    for action in p._actions:
        if action.dest == "dist":
            action.choices = ["none", "horovod", "mwms"]
            action.help = "horovod: start with horovodrun/mpirun/srun; mwms: TensorFlow's own, one srun task per worker"
        elif action.dest == "checkpoint_dir":
            action.help = ("save after every epoch and resume from the newest; SIGTERM/SIGUSR1 stop the run within "
                           "seconds (exit 75), and a stop mid-epoch redoes that epoch (Keras's fit cannot start "
                           "mid-epoch)")
    return p


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter hides the one line that matters
    cfg = flags.config_from_argv(argv, build_parser())
    from .tensorflow.engine import check_config, train_tf

    check_config(cfg)  # a wrong flag fails before the seconds of importing TensorFlow
    if cfg.checkpoint_dir:
        signals.catch_early()  # a warning during the seconds of importing TensorFlow must not kill the run

    import tensorflow as tf

    from .engine import EXIT_REQUEUE

    tf.get_logger().setLevel("ERROR")  # e.g. "callback slower than the batch" on tiny CPU batches
    result = train_tf(cfg)
    return EXIT_REQUEUE if result.preempted else 0


if __name__ == "__main__":
    sys.exit(main())
