"""The device tuning walk (perf.tuning.device_steps, walk): the order, the steps a CPU skips
and why, and what a step keeps, with a stand-in measurement."""

import pytest

from guide_utils.perf import tuning


def test_the_device_walk_is_kernels_then_input_and_a_cpu_skips_the_gpu_only_steps():
    gpu, none = tuning.device_steps("cuda")
    assert [s.name for s in gpu] == ["TF32", "bf16 autocast", "channels_last", "torch.compile", "CUDA graphs",
                                     "fed by the loader", "loader workers", "uint8 input"] and none == []
    cpu, skipped = tuning.device_steps("cpu")
    assert [name for name, _ in skipped] == ["TF32", "CUDA graphs"] and all(why for _, why in skipped)
    assert [s.name for s in cpu] == [s.name for s in gpu if s.name not in ("TF32", "CUDA graphs")]
    assert tuning.DEVICE_BASE["--data"] == "synthetic-resident"  # kernels measured on compute alone


def test_each_step_is_measured_against_what_was_kept_before_it():
    gains = {"--amp": 1.5, "--channels-last": 1.01, "--data": 0.5}  # a stand-in device
    seen, rows_seen = [], []

    def measure(flags, workers):
        seen.append(dict(flags))
        rate = 100.0
        for flag, gain in gains.items():
            changed = flag in flags and (flag not in tuning.DEVICE_BASE or flags[flag] != tuning.DEVICE_BASE[flag])
            rate *= gain if changed else 1.0
        return rate

    steps, _ = tuning.device_steps("cpu")
    steps = [s for s in steps if s.name in ("bf16 autocast", "channels_last", "fed by the loader")]
    rows = tuning.walk(steps, repeats=1, base=dict(tuning.DEVICE_BASE), measure=measure, on_row=rows_seen.append)
    assert rows == rows_seen and [r["kept"] for r in rows] == [True, False, True]  # 1 % < min_gain; always
    assert [round(r["ratio"], 3) for r in rows] == [1.5, 1.01, 0.5]
    assert "--channels-last" not in seen[-1]  # the dropped switch is not carried on


def test_a_walk_measures_its_own_noise_from_the_configurations_it_measured_twice():
    """A step's before is the previous step's after (kept) or before (dropped): their relative
    difference is the walk's repeat; a ratio inside its stage's largest repeat is no finding."""
    def row(stage, step, before, after, kept):
        return {"stage": stage, "step": step, "before_images_per_second": before,
                "after_images_per_second": after, "ratio": after / before, "kept": kept}

    rows = [row("compute kernels", "a", 100.0, 200.0, True),
            row("compute kernels", "b", 220.0, 230.0, True),   # repeats a's after at +10 %
            row("compute kernels", "c", 230.0, 225.0, False),  # repeats b's after exactly
            row("input pipeline", "d", 207.0, 50.0, True),     # repeats c's before at -10 % (compute's)
            row("input pipeline", "e", 60.0, 120.0, True)]     # repeats d's after at +20 %
    walk = tuning.repeats(rows).set_index("step")
    assert walk["repeat"].round(3).tolist()[1:] == [0.1, 0.0, -0.1, 0.2]
    assert walk.loc["a", "noise"] == walk.loc["c", "noise"] == pytest.approx(0.1)  # compute's repeats
    assert walk.loc["e", "noise"] == pytest.approx(0.2)
    assert walk["finding"].tolist() == [True, False, False, True, True]
