#!/usr/bin/env python
"""Where the engine's per-step host time goes: the investigation behind issue 39's step
overhead, kept so it can be run again on any device.

    PYTHONPATH=src:benchmarks python benchmarks/gpu/step_probe.py     # about 75 s on an H100

With the model of ``benchmarks/step_overhead.py`` (``linear`` on 8x8 images, batch 8, one
batch resident on the device, so a step is almost all host work) it prints:

* microseconds per step of the hand-written loop, the engine, and the engine with parts of its
  step taken out (``no-metrics``: Sums.add only counts samples; ``no-sched``: no learning-rate
  schedule; ``bare``: neither), alternating, ``PROBE_ROUNDS`` rounds of ``PROBE_STEPS``;
* the operations that synchronise the GPU during a run (torch's sync debug mode, on a GPU);
* per step, the ATen operations, device kernels and CUDA runtime calls of each loop (the
  profiler over 300 steps less the profiler over 100);
* the functions where each loop spends its own time (cProfile, sorted).

It takes parts out by replacing engine functions in this process (validation skipped, it is
not timed): an investigation tool, not a benchmark with a pass mark. Recorded output:
``src/guide_utils/results/recorded/gpu_h100_2026-11-27_step_probe.txt``.
"""

import collections
import cProfile
import io
import os
import pstats
import statistics
import sys
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")  # as step_overhead.py: before torch is imported

import hand_loop  # noqa: E402
import torch  # noqa: E402
from bench_flags import parse, parser  # noqa: E402
from step_overhead import TINY_STEP  # noqa: E402
from throughput import engine_rate  # noqa: E402

import guide_utils.engine.loop as loop  # noqa: E402
import guide_utils.engine.metrics as metrics  # noqa: E402
import guide_utils.engine.state as state  # noqa: E402

STEPS = int(os.environ.get("PROBE_STEPS", 2000))
ROUNDS = int(os.environ.get("PROBE_ROUNDS", 5))
BATCH = TINY_STEP["per_worker_batch"]
VARIANTS = ["engine", "no-metrics", "no-sched", "bare"]
REAL = {"evaluate": loop.evaluate, "add": metrics.Sums.add, "build": state.build}


def args_for(steps: int, warmup: int):
    p, _ = parser("step_probe", __doc__, steps=steps, warmup=warmup)
    p.set_defaults(**TINY_STEP)
    return parse(p, [])


def no_validation(*_args, **_kwargs):
    return {"loss": 0.0, "top1_err": 0.0, "top5_err": 0.0}


def count_samples_only(self, loss, output, target):
    self.samples += target.shape[0]


def build_without_schedule(*args, **kwargs):
    st = REAL["build"](*args, **kwargs)
    st.scheduler.step = lambda: None
    return st


def use(variant: str) -> None:
    loop.evaluate = no_validation
    metrics.Sums.add = count_samples_only if variant in ("no-metrics", "bare") else REAL["add"]
    state.build = build_without_schedule if variant in ("no-sched", "bare") else REAL["build"]


def us_per_step(images_per_second: float) -> float:
    return 1e6 * BATCH / images_per_second


def timings() -> None:
    use("engine")
    engine_rate(args_for(300, 50))  # warm: first-call costs out of the rounds
    hand_loop.rate(args_for(300, 50), resident=True)
    runs = collections.defaultdict(list)
    for r in range(ROUNDS):
        runs["hand"].append(us_per_step(hand_loop.rate(args_for(STEPS, STEPS // 10), resident=True)))
        for v in VARIANTS:
            use(v)
            runs[v].append(us_per_step(engine_rate(args_for(STEPS, STEPS // 10))))
        print("round", r, {k: round(v[-1], 1) for k, v in runs.items()}, flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print("median us/step", {k: round(v, 1) for k, v in med.items()})
    print("engine - hand", round(med["engine"] - med["hand"], 1),
          " metrics cost", round(med["engine"] - med["no-metrics"], 1),
          " sched cost", round(med["engine"] - med["no-sched"], 1), " bare - hand", round(med["bare"] - med["hand"], 1))


def synchronisations() -> None:
    use("engine")
    torch.cuda.set_sync_debug_mode(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine_rate(args_for(200, 20))
    torch.cuda.set_sync_debug_mode(0)
    where = collections.Counter(f"{os.path.relpath(w.filename)}:{w.lineno} {str(w.message)[:60]}" for w in caught)
    print("sync warnings (200 steps):", len(caught))
    for k, n in where.most_common(15):
        print(f"  {n:5d}  {k}")


def calls(run) -> collections.Counter:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        run()
    c = collections.Counter()
    for e in prof.events():
        if e.name.startswith(("cuda", "cu")):
            c[e.name] += 1
        if e.device_type.name == "CUDA":
            c["[kernels]"] += 1
        if e.name.startswith("aten::"):
            c["[aten ops]"] += 1
    return c


def per_step_calls() -> None:
    use("engine")
    loops = [("hand", lambda s: hand_loop.rate(args_for(s, 10), resident=True)),
             ("engine", lambda s: engine_rate(args_for(s, 10)))]
    for name, run in loops:
        short, long = calls(lambda: run(100)), calls(lambda: run(300))
        per = {k: round((long[k] - short[k]) / 200, 2) for k in set(short) | set(long) if long[k] != short[k]}
        print("per step", name, dict(sorted(per.items(), key=lambda kv: -kv[1])))


def own_time() -> None:
    use("engine")
    for name, run in [("engine", lambda: engine_rate(args_for(STEPS, STEPS // 10))),
                      ("hand", lambda: hand_loop.rate(args_for(STEPS, STEPS // 10), resident=True))]:
        prof = cProfile.Profile()
        prof.enable()
        run()
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(28)
        print(f"--- cProfile {name} ({STEPS} steps)")
        print("\n".join(s.getvalue().splitlines()[6:40]))


def main() -> int:
    print("device", hand_loop.device(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
    timings()
    if torch.cuda.is_available():
        synchronisations()
    per_step_calls()
    own_time()
    return 0


if __name__ == "__main__":
    sys.exit(main())
