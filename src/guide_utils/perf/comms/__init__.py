"""The communication benchmark: how fast these workers allreduce, by message size and gradient knob."""

# The command (cli) and its public face, what notebooks and tests call. The parts are a
# module each: the runtimes (runtimes), the sweep over message sizes (measure), a model's
# gradient list (gradients), starting workers without a launcher (local), and the rows and
# tables (results).
from .cli import PROG, build_parser, main, plan_lines, run_worker
from .gradients import DDP_BUCKETS_MB, METHODS, gradient_shapes, measure_ddp_buckets, measure_gradients
from .local import HOROVOD_GRID, argparse_copy, launch_local, run_local
from .measure import algbw, busbw, iterations, measure_sizes, sizes
from .results import RECORD_COMMAND, format_rows, meta, read_rows, recorded, table
from .runtimes import HOROVOD_DEFAULTS, MIB, RUNTIMES, Runtime, connect, unavailable

__all__ = ["DDP_BUCKETS_MB", "HOROVOD_DEFAULTS", "HOROVOD_GRID", "METHODS", "MIB", "PROG", "RECORD_COMMAND", "RUNTIMES",
           "Runtime", "algbw", "argparse_copy", "build_parser", "busbw", "connect", "format_rows", "gradient_shapes",
           "iterations", "launch_local", "main", "measure_ddp_buckets", "measure_gradients", "measure_sizes", "meta",
           "plan_lines", "read_rows", "recorded", "run_local", "run_worker", "sizes", "table", "unavailable"]
