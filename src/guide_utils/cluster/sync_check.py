"""``python -m guide_utils sync-check``: do N processes really train one model together?

Each rank starts from its *own* random weights and sees its *own* random data, so the only
way all ranks end with identical weights is that the initial broadcast and the gradient
averaging both worked. Run it under the launcher you plan to use, before a long job:

    horovodrun -np 2 --gloo python -m guide_utils sync-check --dist horovod
    mpirun -np 2 python -m guide_utils sync-check --dist horovod
    torchrun --nproc-per-node 2 -m guide_utils sync-check --dist ddp
    srun python -m guide_utils sync-check --dist ddp        # inside a Slurm job

Every rank prints one line; rank 0 then says whether the weights agree (exit 1 if not).
With ``--out DIR`` each rank also writes ``DIR/rank<N>.json`` for tests to inspect.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from ..core.cli import ArgumentParser, one_line_errors
from ..core.errors import GuideError
from ..engine.bookkeeping import weights_digest
from ..engine.distributed import KINDS, init


def _digest(module) -> str:
    """The engines' weights digest (``engine.bookkeeping.weights_digest``) of ``module``."""
    return weights_digest((name, p.detach().cpu().contiguous().numpy()) for name, p in module.named_parameters())


def run(kind: str, steps: int = 5, batch: int = 16, out: Path | None = None) -> dict:
    """Train a tiny model for ``steps`` SGD steps under ``kind``; return this rank's report."""
    import torch

    dist = init(kind)
    try:
        torch.manual_seed(1000 + dist.rank)  # deliberately different on every rank
        model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(dist.device)
        initial = _digest(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model, optimizer = dist.prepare(model, optimizer)
        losses = []
        for _ in range(steps):
            x = torch.randn(batch, 32, device=dist.device)
            y = torch.randint(0, 4, (batch,), device=dist.device)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(round(loss.item(), 6))
        module = getattr(model, "module", model)  # DDP wraps the model
        report = {"dist": kind, "rank": dist.rank, "size": dist.size, "pid": os.getpid(),
                  "host": socket.gethostname(), "initial_digest": initial,
                  "final_digest": _digest(module), "losses": losses}
        print(f"[rank {dist.rank}/{dist.size} pid {report['pid']}] initial {initial} -> final "
              f"{report['final_digest']}", flush=True)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"rank{dist.rank}.json").write_text(json.dumps(report, indent=1))
        reports = dist.allgather_object(report)
        finals = {r["final_digest"] for r in reports}
        report["agree"] = len(finals) == 1
        if dist.is_root:
            verdict = "agree" if report["agree"] else "DIFFER"
            print(f"sync-check ({kind}): {dist.size} rank(s), final weights {verdict}", flush=True)
        return report
    finally:
        dist.shutdown()


PROG = "python -m guide_utils sync-check"


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--dist", choices=KINDS, required=True, help="how the processes talk")
    parser.add_argument("--steps", type=int, default=5, help="SGD steps (default %(default)s)")
    parser.add_argument("--out", type=Path, help="directory for one rank<N>.json per rank")
    args = parser.parse_args(argv)
    if args.steps <= 0:
        raise GuideError(f"--steps must be positive, got {args.steps}")
    report = run(args.dist, steps=args.steps, out=args.out)
    return 0 if report["agree"] else 1

if __name__ == "__main__":
    sys.exit(main())
