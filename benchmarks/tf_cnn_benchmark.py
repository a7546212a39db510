#!/usr/bin/env python
"""Synthetic-data throughput in the style of tf_cnn_benchmarks (the thesis's experiments
1-3, TensorFlow rows), for the guide's TensorFlow door, next to its PyTorch engine.

For each per-worker batch (default 32, 64, 128) it trains the same model on the same
synthetic images for --steps iterations with TensorFlow/Keras and then with PyTorch, in this
one process (or in every process of a horovodrun/mpirun/srun launch with --dist horovod),
excludes the first --warmup iterations from the timing, and prints tf_cnn_benchmarks' own
summary line (``total images/sec: ...``, which guide_utils.results.logs reads) per framework and the
TensorFlow/PyTorch ratio. Every measurement is also a run record in --results-dir, the same
format as every other run, so one plot compares them (notebook 08). The other flags of
``python -m guide_utils.train`` apply to every measurement.

    python benchmarks/tf_cnn_benchmark.py                                  # CPU, small model, ~1 min
    srun --mpi=pmix python benchmarks/tf_cnn_benchmark.py --dist horovod --model resnet50 \\
        --image-size 224 --steps 200 --warmup 20 --results-dir results/exp1-3   # GPUs, as in the thesis
"""

from __future__ import annotations

import os
import sys
import tempfile

from bench_flags import parse, parser, timed_config

from guide_utils.core.cli import GuideError, one_line_errors

PROG = "python benchmarks/tf_cnn_benchmark.py"


def _config(args, batch: int, results: str, framework: str):
    return timed_config(args, per_worker_batch=batch, workers=args.workers_hint, results_dir=results,
                        run_name=f"bench-{framework}-{args.model}-{args.dist}-bs{batch}")


@one_line_errors(PROG)
def main(argv=None) -> int:
    p, own = parser(PROG, __doc__, steps=30, warmup=10)
    own.add_argument("--batches", type=int, nargs="+", default=[32, 64, 128], help="per-worker batch sizes")
    own.add_argument("--dist", choices=["none", "horovod"], default="none")
    own.add_argument("--frameworks", nargs="+", choices=["tensorflow", "pytorch"], default=["tensorflow", "pytorch"])
    own.add_argument("--results-dir", help="keep the run records here (default: a temporary folder)")
    args = parse(p, argv)
    if any(b <= 0 for b in args.batches):
        raise GuideError(f"--batches must be positive integers, got {args.batches}")
    # Synthetic samples per run: just enough for --steps on every worker (validation then
    # sees a quarter of that, so it stays short).
    args.workers_hint = int(next((os.environ[v] for v in ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                                            "SLURM_NTASKS") if os.environ.get(v)), 1))

    from guide_utils.engine import train
    from guide_utils.tensorflow.engine import train_tf

    runners = {"tensorflow": train_tf, "pytorch": train}
    with tempfile.TemporaryDirectory() as tmp:
        results = args.results_dir or tmp
        rates: dict[tuple[str, int], float] = {}
        for batch in args.batches:
            for fw in args.frameworks:
                result = runners[fw](_config(args, batch, results, fw))
                if result.record_path is None:  # not rank 0: measure, print nothing
                    continue
                rate = result.epochs[0]["images_per_second"]
                rates[fw, batch] = rate
                print(f"{fw:10s} {args.model} batch {batch:4d} per worker ({args.dist})", flush=True)
                print(f"total images/sec: {rate:.2f}", flush=True)
        for batch in args.batches:
            if ("tensorflow", batch) in rates and ("pytorch", batch) in rates:
                print(f"batch {batch:4d}: TensorFlow/PyTorch throughput ratio "
                      f"{rates['tensorflow', batch] / rates['pytorch', batch]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
