"""Training on many workers from a notebook: ipyparallel engines that run the guide's engine."""

# Its public face, what notebooks call: the cluster of engines (engines, whose docstring shows
# a notebook's use of it) and the notebook's helpers (notebook).
from ...runtime.ports import LOOPBACK
from .cleanup import job_state
from .engines import DEFAULT_TIMEOUT, ENGINE_KINDS, ENGINE_PORTS_NEEDED, HEARTBEAT_MISSES, EngineCluster
from .follow import EPOCH_LINE, RECORD, InteractiveResult
from .launch import controller_address, require_ipyparallel
from .notebook import one_line_errors, print_plan
from .watch import Deadlines

__all__ = ["DEFAULT_TIMEOUT", "ENGINE_KINDS", "ENGINE_PORTS_NEEDED", "EPOCH_LINE", "HEARTBEAT_MISSES", "LOOPBACK",
           "RECORD", "Deadlines", "EngineCluster", "InteractiveResult", "controller_address", "job_state",
           "one_line_errors", "print_plan", "require_ipyparallel"]
