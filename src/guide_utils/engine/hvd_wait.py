"""Horovod's waits for ranks that share CPU cores: poll and sleep instead of spinning.

Horovod's PyTorch binding waits for a collective (``hvd.synchronize``, which its optimizer's
``step()``, ``broadcast_parameters`` and ``allgather_object`` all call) in a loop that
polls the handle and calls ``sched_yield`` until the operation is done: a waiting rank keeps
its core busy. With a core per rank that costs only power. Where ranks share cores (two
workers on a laptop beside Jupyter, a CI machine running tests side by side) the spinning
rank takes CPU time from the peer it waits for, so both finish later: with two busy loops
beside two Horovod ranks on two cores, 4 smoke epochs took 1.0-1.5 CPU-s more per rank
with the spin than with this wait (two runs each), and the last epoch ran at a quarter to a
third of the rate.

``sleep_while_waiting`` replaces the wait in Horovod's modules with one that asks
``hvd.poll`` (Horovod's public "is it done?") and sleeps between asks, from 10 us up to
1 ms, then lets Horovod's own ``synchronize`` collect the finished result. The engine does
this on CPU devices only: on a GPU node each rank has cores of its own, and a long wait
would end up to 1 ms later.
"""

from __future__ import annotations

import sys
import time

FIRST_SLEEP_S = 1e-5
LONGEST_SLEEP_S = 1e-3


def sleep_while_waiting() -> None:
    """Make every loaded ``horovod.torch`` module wait by polling and sleeping (idempotent)."""
    from horovod.torch import mpi_ops

    spinning = getattr(mpi_ops.synchronize, "__wrapped__", mpi_ops.synchronize)

    def synchronize(handle):
        delay = FIRST_SLEEP_S
        try:
            while not mpi_ops.poll(handle):
                time.sleep(delay)
                delay = min(2 * delay, LONGEST_SLEEP_S)
        except ValueError:  # a handle Horovod does not know: its own synchronize answers that
            pass
        return spinning(handle)  # done: the result at once (or Horovod's error for a failed operation)

    synchronize.__wrapped__ = spinning
    synchronize.__doc__ = spinning.__doc__
    # The optimizer, broadcast_parameters and allgather_object bound the function by name
    # when they were imported: replace it wherever a horovod.torch module holds it.
    for name, module in list(sys.modules.items()):
        if name != "horovod.torch" and not name.startswith("horovod.torch."):
            continue
        current = getattr(module, "synchronize", None)
        if current is spinning or getattr(current, "__wrapped__", None) is spinning:
            module.synchronize = synchronize
