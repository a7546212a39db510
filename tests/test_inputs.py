"""The input path to the device (engine.inputs): uint8 batches normalised on the device equal
the float path's, in the same order; the resident synthetic batch; no tensor made from host
data in the step; the loader-worker default."""

import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from guide_utils.core.config import make_config
from guide_utils.core.errors import GuideError
from guide_utils.data.datasets import make_jpeg_folder, write_shards
from guide_utils.data.loaders import build_data, resolve_input_dtype
from guide_utils.engine.distributed import Dist
from guide_utils.engine.inputs import DeviceFeed, Inputs
from guide_utils.engine.metrics import Sums
from guide_utils.runtime.cpus import default_loader_workers

CPU = Dist(kind="none", device=torch.device("cpu"))


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = make_jpeg_folder(tmp_path_factory.mktemp("in") / "photos", per_class=6, val_per_class=3, size=72)
    return root, write_shards(root, root.parent / "shards", image_size=40)


def _epoch(spec, dtype, *, channels_last=False, epoch=1, start=0):
    cfg = make_config("full", data=str(spec), image_size=32, per_worker_batch=4, loader_workers=0, seed=3,
                      channels_last=channels_last)
    bundle = build_data(str(spec), image_size=32, seed=3, input_dtype=dtype)
    inputs = Inputs(cfg, bundle, CPU)
    inputs.sampler.set_epoch(epoch)
    inputs.sampler.set_start(start)
    return list(inputs.train_batches()), list(inputs.val_batches())


@pytest.mark.parametrize("data", ["shards", "jpeg"])
def test_uint8_batches_normalised_on_the_device_equal_the_float_path(photos, data):
    spec = photos[1] if data == "shards" else photos[0]
    (train_f, val_f), (train_u, val_u) = _epoch(spec, "float32"), _epoch(spec, "uint8")
    assert len(train_f) == len(train_u) == 3 and len(val_f) == len(val_u) == 2
    for (xf, yf), (xu, yu) in zip(train_f + val_f, train_u + val_u):
        assert xu.dtype == xf.dtype == torch.float32 and xu.shape == xf.shape
        assert torch.equal(yf, yu)  # same samples in the same order
        # the same operations in the same order, on the host or the "device": float32 exact
        # up to the last bit or two of rounding
        torch.testing.assert_close(xu, xf, rtol=1e-6, atol=1e-6)


def test_channels_last_is_applied_on_the_device_after_the_copy(photos):
    (train_f, _), (train_u, _) = _epoch(photos[1], "float32", channels_last=True), \
        _epoch(photos[1], "uint8", channels_last=True)
    for (xf, _), (xu, _) in zip(train_f, train_u):
        assert xf.is_contiguous(memory_format=torch.channels_last)
        assert xu.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(xu, xf, rtol=1e-6, atol=1e-6)


def test_a_resumed_epoch_feeds_the_rest_of_the_same_batches(photos):
    whole, _ = _epoch(photos[1], "uint8")
    rest, _ = _epoch(photos[1], "uint8", start=4)
    assert len(rest) == len(whole) - 1
    for (xa, ya), (xb, yb) in zip(whole[1:], rest):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_step_makes_no_tensor_from_host_numbers():
    # aten.lift_fresh is a tensor made from host data: on a GPU a blocking copy that makes the
    # host wait for every queued kernel (the old Sums.add did it every step). hold=1: the hits
    # are counted in this very add, so the recorder sees all of its work.
    sums = Sums(torch.device("cpu"), hold=1)
    feed = DeviceFeed(torch.device("cpu"), normalize=([0.5] * 3, [0.25] * 3))
    images, target = torch.randint(0, 256, (8, 3, 4, 4), dtype=torch.uint8), torch.randint(0, 10, (8,))
    loss, output = torch.tensor(2.0), torch.randn(8, 10)
    with _Ops() as seen:
        x, y = feed.prepare(images, target)
        sums.add(loss, output, y)
    assert "aten.topk.default" in seen.ops and "aten.sub_.Tensor" in seen.ops  # the recorder sees the step
    assert "aten.lift_fresh.default" not in seen.ops, seen.ops
    sums.add(torch.tensor(1.0), output, y)
    loss, hits1, hits5, n = sums.totals(CPU)
    assert n == 16 and loss == pytest.approx(2.0 * 8 + 1.0 * 8) and 0 <= hits1 <= hits5 <= 16


def test_resident_batches_are_one_batch_made_once():
    cfg = make_config("full", data="synthetic-resident", image_size=16, per_worker_batch=8, synthetic_size=40,
                      loader_workers=0, channels_last=True)
    bundle = build_data("synthetic-resident", image_size=16, synthetic_size=40)
    inputs = Inputs(cfg, bundle, CPU)
    batches = list(inputs.train_batches())
    assert len(batches) == 5 and inputs.workers == 0 and inputs.input_dtype == "resident"
    assert all(x.data_ptr() == batches[0][0].data_ptr() for x, _ in batches)  # no copy, no conversion
    assert batches[0][0].is_contiguous(memory_format=torch.channels_last)
    inputs.sampler.set_start(24)
    assert len(list(inputs.train_batches())) == 2 and len(list(inputs.train_batches())) == 5


def test_input_dtype_and_loader_workers_defaults():
    assert resolve_input_dtype("auto", "synthetic", "cuda") == "uint8"
    assert resolve_input_dtype("auto", "/data/imagenet", "cuda") == "uint8"
    assert resolve_input_dtype("auto", "mnist1d", "cuda") == "float32"
    assert resolve_input_dtype("auto", "synthetic", "cpu") == "float32"  # CPU results unchanged
    with pytest.raises(GuideError, match="--input-dtype uint8 is for images"):
        build_data("digits", input_dtype="uint8")
    # the rank's share of CPUs less one for itself, at most 16; on a CPU 4 (unchanged)
    assert [default_loader_workers("cuda", n) for n in (8, 4, 128, 1)] == [7, 3, 16, 1]
    assert default_loader_workers("cpu", 2) == 4


# The CPU sets a cluster gives a node's ranks, by launcher: (launcher's environment, the
# affinity each rank sees, the share each rank may count on). A cgroup that limits the job to
# part of the node is invisible to os.cpu_count(), so the share never depends on it.
SHARES = {
    # srun binds each task to its own --cpus-per-task: the rank's mask is its own
    "srun, bound": ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
                     "SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_CPUS_PER_TASK": "7", "SLURM_JOB_ID": "1"}, 7, 7),
    # a site without task/affinity: every task sees the step's CPUs, the job asked 7 per task
    "srun, unbound": ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
                       "SLURM_STEP_TASKS_PER_NODE": "4", "SLURM_CPUS_PER_TASK": "7", "SLURM_JOB_ID": "1"}, 28, 7),
    # LUMI-like: one torchrun per node on the union of 8 GCDs' masks, 56 CPUs for 8 ranks
    "torchrun in an srun step": ({"SLURM_STEP_ID": "0", "SLURM_CPUS_PER_TASK": "56", "SLURM_JOB_ID": "1",
                                  "SLURM_NODEID": "0", "TORCHELASTIC_RUN_ID": "1", "RANK": "3", "WORLD_SIZE": "8",
                                  "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"}, 56, 7),
    # two GPUs of a shared 40-core node, 20 CPUs in the job's cgroup, torchrun without Slurm
    "torchrun alone": ({"TORCHELASTIC_RUN_ID": "1", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                        "LOCAL_WORLD_SIZE": "2"}, 20, 10),
    # horovodrun (mpirun --bind-to none) starts four ranks on one node's 32 CPUs
    "horovodrun": ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "4",
                    "HOROVOD_HOSTNAME": "n1"}, 32, 8),
}


@pytest.mark.parametrize("case", SHARES)
def test_loader_workers_count_the_cpus_the_ranks_of_a_node_share_once(case, monkeypatch):
    from guide_utils.runtime import launchers
    from guide_utils.runtime.launchers import base

    env, cpus, share = SHARES[case]
    monkeypatch.setattr(base, "affinity", lambda: list(range(cpus)))
    launcher = launchers.detect(env)
    assert launcher is not None and launcher.cpu_share() == share, (launcher, case)
    assert default_loader_workers("cuda", launcher.cpu_share()) == min(16, share - 1)


class _Counting(Dist):
    def allreduce_mean(self, tensor, name="metric"):
        self.calls = getattr(self, "calls", 0) + 1
        return tensor.clone()


def test_the_stop_check_alone_sends_nothing_and_with_ranks_agrees():
    from guide_utils.engine.loop import _stop_agreed
    from guide_utils.engine.signals import StopFlag

    stop = StopFlag()
    alone, two = _Counting(kind="none"), _Counting(kind="none", size=2)
    assert not _stop_agreed(alone, stop) and not _stop_agreed(two, stop)
    stop.signum = 10
    assert _stop_agreed(alone, stop) and _stop_agreed(two, stop)
    assert getattr(alone, "calls", 0) == 0 and two.calls == 2  # alone: the flag is read, no tensor made


@pytest.mark.parametrize("flags, fragment", [
    (["--loader-workers", "many"], "--loader-workers"),
    (["--input-dtype", "int4"], "--input-dtype"),
    (["--tf32", "yes"], "--tf32"),
    (["--compile-mode", "fast"], "--compile-mode"),
])
def test_the_new_flags_refuse_bad_values_in_one_line(flags, fragment, capsys):
    from guide_utils.core.flags import build_parser

    with pytest.raises(SystemExit) as exc:  # argparse's usage error, as the command prints it
        build_parser().parse_args(["--profile", "smoke", *flags])
    code, err = exc.value.code, capsys.readouterr().err.strip()
    assert code == 2 and fragment in err and len(err.splitlines()) == 1, err


def test_the_new_settings_parse_and_validate():
    from guide_utils.core.flags import config_from_argv

    cfg = config_from_argv(["--loader-workers", "auto", "--input-dtype", "uint8", "--tf32", "on",
                            "--compile-mode", "reduce-overhead", "--data", "synthetic-resident"])
    assert (cfg.loader_workers, cfg.input_dtype, cfg.tf32, cfg.compile_mode) == ("auto", "uint8", "on",
                                                                                 "reduce-overhead")
    assert config_from_argv(["--loader-workers", "3"]).loader_workers == 3
    with pytest.raises(GuideError, match="--loader-workers must be auto or 0 or more"):
        make_config("smoke", loader_workers=-2).validate()


def _old_sums(batches):
    """The metrics as the engine summed them before (one stacked float64 vector per step)."""
    t = torch.zeros(4, dtype=torch.float64)
    for loss, output, target in batches:
        pred = output.topk(min(5, output.shape[1]), dim=1).indices
        hits = pred.eq(target.unsqueeze(1))
        c1, c5 = hits[:, :1].any(dim=1).sum(), hits[:, :5].any(dim=1).sum()
        n = t.new_tensor(float(target.shape[0]))
        t += torch.stack([loss.double() * n, c1.double(), c5.double(), n])
    return t.tolist()


@pytest.mark.parametrize("classes, hold", [(3, 1), (10, 1), (10, 4), (10, 16)])
def test_the_metric_sums_are_the_old_ones_with_fewer_kernels(classes, hold):
    g = torch.Generator().manual_seed(classes)
    sizes = [8, 8, 8, 8, 8, 5]  # the last batch smaller, as a validation shard's can be
    batches = [(torch.rand((), generator=g) * 5, torch.randn(b, classes, generator=g),
                torch.randint(0, classes, (b,), generator=g)) for b in sizes]
    sums, first, resumed = (Sums(torch.device("cpu"), hold=hold) for _ in range(3))
    for b in batches:
        sums.add(*b)
    for b in batches[:3]:
        first.add(*b)
    resumed.restore(first.totals(CPU))  # an epoch interrupted after 3 steps, then resumed
    for b in batches[3:]:
        resumed.add(*b)
    assert sums.totals(CPU) == resumed.totals(CPU) == _old_sums(batches)  # exactly, float64 in the same order
    with _Ops() as seen:
        sums.add(*batches[0])
    kernels = [op for op in seen.ops if op.split(".")[1] not in ("detach", "unsqueeze", "alias", "slice")]
    if hold == 1:  # counted at once: 12 before (two any/sum pairs, three casts, a stack), then 7, now 5
        assert len(kernels) <= 5, kernels
    else:  # only the loss is added; the hits wait for the other steps
        assert kernels == ["aten.add_.Tensor"], kernels


def test_the_metrics_count_kept_steps_in_one_go_and_bound_what_they_keep(monkeypatch):
    g = torch.Generator().manual_seed(0)
    step = [(torch.rand((), generator=g), torch.randn(4, 10, generator=g), torch.randint(0, 10, (4,), generator=g))
            for _ in range(7)]
    sums = Sums(torch.device("cpu"), hold=3)
    with _Ops() as seen:
        for b in step:
            sums.add(*b)
    assert seen.ops.count("aten.topk.default") == 2 and len(sums._held) == 1  # after steps 3 and 6
    monkeypatch.setattr(Sums, "HOLD_BYTES", 2 * 4 * 10 * 4)  # two steps' outputs, float32
    small = Sums(torch.device("cpu"), hold=100)
    with _Ops() as seen:
        for b in step:
            small.add(*b)
    assert seen.ops.count("aten.topk.default") == 3  # the byte bound, not hold, counted them
    assert small.totals(CPU) == sums.totals(CPU) == _old_sums(step)


def test_cuda_graph_modes_count_each_step_at_once():
    # A CUDA graph's output is overwritten at its next replay: the loop must not keep it. The
    # modes that make graphs are read from torch.compile's own options, not from a list here.
    import torch._inductor

    from guide_utils.core.config import COMPILE_MODES
    from guide_utils.engine.loop import GRAPHED_MODES

    graphed = {m for m in COMPILE_MODES if m and torch._inductor.list_mode_options(m).get("triton.cudagraphs")}
    assert graphed == set(GRAPHED_MODES)


def test_the_engine_counts_the_cpus_of_the_launcher_that_started_it(monkeypatch):
    """An srun task (rank 1 of 16, 8 per node, bound to its own 7 CPUs) joining DDP: the engine
    exports torch's variables (RANK, LOCAL_WORLD_SIZE) for its env:// init, after which the
    environment reads as torchrun's. The share comes from the launcher found before that: 7
    CPUs, 6 loader workers, not 7 // 8."""
    import torch.distributed as tdist

    from guide_utils.engine import distributed
    from guide_utils.runtime import launchers
    from guide_utils.runtime.launchers import base

    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_", "PMI", "HOROVOD_", "TORCHELASTIC_")):
            monkeypatch.delenv(name)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)  # recorded as absent: what the engine exports is undone afterwards
    task = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
            "SLURM_NTASKS": "16", "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_CPUS_PER_TASK": "7",
            "SLURM_STEP_NODELIST": "n[1-2]", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for name, value in task.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(base, "affinity", lambda: list(range(7)))
    monkeypatch.setattr(tdist, "init_process_group", lambda **kw: None)
    monkeypatch.setattr(tdist, "get_rank", lambda: 1)
    monkeypatch.setattr(tdist, "get_world_size", lambda: 16)
    dist = distributed.init("ddp")
    assert (dist.rank, dist.local_size, dist.cpus) == (1, 8, 7)
    assert launchers.detect().name == "torchrun"  # what a detection after the export would read
    assert default_loader_workers("cuda", dist.cpus) == 6  # what Inputs starts on a GPU
