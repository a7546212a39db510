"""guide_utils.core.schedules: the thesis's warmup pseudocode, properties, and the adapters."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guide_utils.core.schedules import lr_at, schedule_table, torch_scheduler


def appendix_9_stepping(epoch, warmup_epochs=5, per_worker_learning_rate=0.05, number_of_workers=32):
    """The thesis's Appendix 9 pseudocode, transcribed literally."""
    global_learning_rate = number_of_workers * per_worker_learning_rate
    if epoch < warmup_epochs:
        return global_learning_rate * ((epoch + 1) / (warmup_epochs + 1))
    return global_learning_rate


def appendix_13_gradual(epoch, warmup_epochs=5, per_worker_batch_size=128, linearly_scaled_learning_rate=1.6):
    """The thesis's Appendix 13 (W=5) and 15 (W=10) pseudocode, transcribed literally."""
    base_learning_rate = (per_worker_batch_size / 256) * 0.1
    step_size = (linearly_scaled_learning_rate - base_learning_rate) / warmup_epochs
    if epoch < warmup_epochs:
        return base_learning_rate + (step_size * epoch)
    return linearly_scaled_learning_rate


def test_stepping_equals_appendix_9_before_the_first_drop():
    for e in range(30):
        assert lr_at(e, peak_lr=1.6, warmup="stepping") == pytest.approx(appendix_9_stepping(e), rel=1e-12)
    assert [round(lr_at(e, peak_lr=1.6, warmup="stepping"), 5) for e in range(6)] == \
        [0.26667, 0.53333, 0.8, 1.06667, 1.33333, 1.6]


@pytest.mark.parametrize("warmup_epochs", [5, 10])
def test_gradual_equals_appendices_13_and_15(warmup_epochs):
    for e in range(30):
        expected = appendix_13_gradual(e, warmup_epochs=warmup_epochs)
        got = lr_at(e, peak_lr=1.6, warmup="gradual", warmup_epochs=warmup_epochs, warmup_start_lr=0.05)
        assert got == pytest.approx(expected, rel=1e-12)
    assert [round(lr_at(e, peak_lr=1.6, warmup="gradual", warmup_start_lr=0.05), 2) for e in range(6)] == \
        [0.05, 0.36, 0.67, 0.98, 1.29, 1.6]


def test_drops_at_30_60_80():
    assert [lr_at(e, peak_lr=1.6) for e in (29, 30, 59, 60, 79, 80, 89)] == \
        pytest.approx([1.6, 0.16, 0.16, 0.016, 0.016, 0.0016, 0.0016])


def test_fractional_epochs():
    # stepping is constant within an epoch; gradual moves every iteration
    assert lr_at(2.9, peak_lr=1.6, warmup="stepping") == lr_at(2, peak_lr=1.6, warmup="stepping")
    assert lr_at(2.5, peak_lr=1.6, warmup="gradual", warmup_start_lr=0.05) == pytest.approx(0.05 + 1.55 * 2.5 / 5)


def test_schedule_table():
    table = schedule_table(90, peak_lr=0.4, warmup="stepping")
    assert len(table) == 90 and table[0] == (0, pytest.approx(0.4 / 6)) and table[89][1] == pytest.approx(0.0004)


@pytest.mark.parametrize("kwargs, name", [
    ({"peak_lr": 0}, "peak_lr"),
    ({"peak_lr": 1, "warmup": "linear"}, "warmup"),
    ({"peak_lr": 1, "warmup": "stepping", "warmup_epochs": 0}, "warmup_epochs"),
    ({"peak_lr": 1, "warmup": "stepping", "warmup_epochs": 40}, "warmup_epochs"),
    ({"peak_lr": 1, "warmup": "gradual"}, "warmup_start_lr"),
    ({"peak_lr": 1, "warmup": "gradual", "warmup_start_lr": 2}, "warmup_start_lr"),
    ({"peak_lr": 1, "milestones": (60, 30)}, "milestones"),
    ({"peak_lr": 1, "gamma": 0}, "gamma"),
])
def test_bad_arguments_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=name):
        lr_at(1, **kwargs)


def test_negative_epoch():
    with pytest.raises(ValueError, match="epoch"):
        lr_at(-0.5, peak_lr=1)


schedules = st.builds(
    lambda peak, frac, w, kind: {"peak_lr": peak, "warmup": kind, "warmup_epochs": w,
                                 "warmup_start_lr": peak * frac if kind == "gradual" else None},
    st.floats(1e-4, 10), st.floats(0, 1), st.integers(1, 29), st.sampled_from(["stepping", "gradual"]))


@given(schedules, st.lists(st.floats(0, 90), min_size=2, max_size=20))
def test_warmup_properties(schedule, epochs):
    w, peak = schedule["warmup_epochs"], schedule["peak_lr"]
    during = sorted(e for e in epochs if e < w)
    values = [lr_at(e, **schedule) for e in during]
    assert all(a <= b + 1e-12 for a, b in zip(values, values[1:]))  # non-decreasing in warmup
    assert lr_at(w, **schedule) == pytest.approx(peak)  # reaches the peak
    after = sorted(e for e in epochs if e >= w)
    tail = [lr_at(e, **schedule) for e in after]
    assert all(a >= b - 1e-12 for a, b in zip(tail, tail[1:]))  # only drops afterwards
    assert all(0 <= v <= peak * (1 + 1e-12) for v in values + tail)  # never negative, never above peak


def test_torch_adapter_follows_lr_at_per_iteration():
    import torch

    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=123.0)  # overwritten by the adapter
    kw = dict(peak_lr=0.8, warmup="gradual", warmup_epochs=2, warmup_start_lr=0.1, milestones=(3,))
    sched = torch_scheduler(opt, steps_per_epoch=4, **kw)
    seen = []
    for _ in range(4 * 4):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([lr_at(i / 4, **kw) for i in range(16)], abs=1e-12)

    # resume: a new scheduler loaded from the state continues at the same point
    state = sched.state_dict()
    opt2 = torch.optim.SGD(torch.nn.Linear(3, 1).parameters(), lr=0.0)
    sched2 = torch_scheduler(opt2, steps_per_epoch=4, **kw)
    sched2.load_state_dict(state)
    opt2.step()
    sched2.step()
    sched.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"]) == pytest.approx(lr_at(17 / 4, **kw))


@pytest.mark.parametrize("kw", [dict(peak_lr=1.6, warmup="stepping", warmup_epochs=2, milestones=[3], gamma=0.5),
                                dict(peak_lr=0.4, milestones=(1, 4))], ids=["stepping", "none"])
def test_torch_adapter_checks_once_and_then_follows_lr_at(kw, monkeypatch):
    import torch

    from guide_utils.core import schedules

    checks = []
    check = schedules._check
    monkeypatch.setattr(schedules, "_check", lambda *a: checks.append(a) or check(*a))
    opt = torch.optim.SGD(torch.nn.Linear(3, 1).parameters(), lr=0.0)
    sched = torch_scheduler(opt, steps_per_epoch=3, start_epoch=1, **kw)  # a run resumed at epoch 1
    seen = []
    for _ in range(3 * 5):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert len(checks) == 1  # the settings are checked when the scheduler is made, not at each step
    assert seen == pytest.approx([lr_at(1 + i / 3, **kw) for i in range(15)], abs=1e-12)
    with pytest.raises(ValueError, match="milestones"):
        torch_scheduler(opt, steps_per_epoch=3, **{**kw, "milestones": (4, 2)})


@pytest.mark.slow
def test_keras_adapter_follows_lr_at_per_batch():
    import numpy as np
    import tensorflow as tf

    from guide_utils.core.schedules import keras_callback

    kw = dict(peak_lr=0.4, warmup="gradual", warmup_epochs=2, warmup_start_lr=0.1, milestones=(2,))
    seen = []

    class Spy(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(tf.keras.backend.get_value(self.model.optimizer.learning_rate)))

    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.0, momentum=0.9), loss="mse")
    x, y = np.random.rand(24, 4).astype("float32"), np.random.rand(24, 2).astype("float32")
    model.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False,
              callbacks=[keras_callback(steps_per_epoch=3, **kw), Spy()])
    assert seen == pytest.approx([lr_at(i / 3, **kw) for i in range(9)], rel=1e-6)
    assert not math.isnan(seen[-1])
