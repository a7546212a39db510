"""The engine layer, above data: the one PyTorch training loop every notebook, sbatch script
and test runs.

``loop`` is the story of a run; ``plan`` (workers, batches, learning rate, steps, schedule)
and ``bookkeeping`` (the run record, the printed lines, the summary, the weights digest) are
shared with the TensorFlow door; the rest are the loop's parts: ``models``, ``sampling``,
``distributed`` (none/Horovod/DDP), ``checkpoint``, ``signals``.
"""

from .loop import EXIT_REQUEUE, RunResult, train

__all__ = ["EXIT_REQUEUE", "RunResult", "train"]
