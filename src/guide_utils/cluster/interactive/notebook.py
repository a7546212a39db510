"""What a notebook calls besides the cluster: a GuideError shown as one line, and the plan of
a run, started nowhere (the chapter's cells at a profile that cannot run here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import textwrap
from pathlib import Path

from ...core.config import TrainConfig
from ...core.errors import GuideError
from .launch import controller_address


def one_line_errors() -> None:
    """In a notebook, show a GuideError as one line (``error: ...``), without a traceback,
    like the guide's commands do; every other exception keeps its traceback."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return

    def show(shell, etype, value, tb, tb_offset=None):
        print(f"error: {value}", file=sys.stderr)

    shell.set_custom_exc((GuideError,), show)


def print_plan(cfg: TrainConfig, *, n: int, engines: str, site: str | None = None, profile: str = "smoke",
               controller_ip: str | None = None, walltime: str = "01:00:00") -> None:
    """What ``EngineCluster(n, engines=...).train(cfg)`` would do, started nowhere: the
    engines, the controller address, the training, and the batch script Slurm engines get."""
    from ...studies.experiment_plans import PlannedRun, describe

    settings = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "extra"}
    ip = controller_address(controller_ip)
    where = "mpiexec on this node" if engines == "mpi" else "a Slurm job from the site profile"
    # At most 100 characters a line: what a notebook's output column (and the book's) shows.
    print(textwrap.fill(f'interactive: EngineCluster(n={n}, engines="{engines}"): {n} ipyparallel engines '
                        f"({where}), controller on {ip}", 100, subsequent_indent="    "))
    print(textwrap.fill(f"{describe(PlannedRun('interactive', n, settings), profile)}; --dist {cfg.dist}", 100,
                        initial_indent="    ", subsequent_indent="        "))
    if engines == "slurm" or site:
        from ...core.paths import repo_root
        from ..sites import engines_batch_script, read_site

        s = read_site(site)
        script = engines_batch_script(s, n, walltime=walltime, log="logs/ipengine-<cluster>-%j.out",
                                      controller=("<host>", "<port>"))  # type: ignore[arg-type]
        script = script.format(cluster_id="<cluster>", program_and_args="python -m ipyparallel.engine --mpi ...")
        shown = Path(s.file).resolve()
        with contextlib.suppress(ValueError):  # a profile of the repository: its path in it
            shown = shown.relative_to(repo_root().resolve())
        print(f"    the engines' batch script (site {s.name}, {shown}; <repo>: this repository):")
        script = script.replace(str(repo_root().resolve()), "<repo>")
        print("\n".join("  | " + line for line in script.splitlines()))
