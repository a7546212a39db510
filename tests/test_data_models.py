"""Datasets and models by name, and their one-line errors."""


import pytest
import torch

from conftest import make_image_tree
from guide_utils.core.errors import GuideError
from guide_utils.data.loaders import build_data, describe
from guide_utils.engine.models import build_model


def test_synthetic_is_deterministic_and_imagenet_shaped():
    a = build_data("synthetic", synthetic_size=512)
    b = build_data("synthetic", synthetic_size=512)
    assert a.input_shape == (3, 224, 224) and a.num_classes == 1000 and a.synthetic
    assert torch.equal(a.train[5][0], b.train[5][0]) and a.train[5][1] == b.train[5][1]
    assert all(0 <= a.train[i][1] < 1000 for i in range(512))


def test_mnist1d_is_generated_and_cached(tmp_path, monkeypatch):
    bundle = build_data("mnist1d", mnist1d_samples=600, cache_dir=tmp_path)
    assert describe(bundle) == "mnist1d: 480 train / 120 val samples, 10 classes, input (1, 40)"
    x, y = bundle.train[0]
    assert x.shape == (1, 40) and x.dtype == torch.float32 and y.dtype == torch.int64
    cached = list(tmp_path.glob("mnist1d-600-*.npz"))
    assert len(cached) == 1

    import mnist1d.data

    monkeypatch.setattr(mnist1d.data, "make_dataset", lambda args: pytest.fail("regenerated despite the cache"))
    again = build_data("mnist1d", mnist1d_samples=600, cache_dir=tmp_path)
    assert torch.equal(again.train[7][0], bundle.train[7][0])


def test_corrupt_mnist1d_cache_is_regenerated(tmp_path):
    build_data("mnist1d", mnist1d_samples=600, cache_dir=tmp_path)
    cached = next(tmp_path.glob("mnist1d-600-*.npz"))
    cached.write_bytes(b"broken")
    with pytest.warns(UserWarning, match="unreadable"):
        assert len(build_data("mnist1d", mnist1d_samples=600, cache_dir=tmp_path).train) == 480


def test_digits_are_real_8x8_images_with_a_fixed_split():
    a, b = build_data("digits", seed=0), build_data("digits", seed=5)
    assert describe(a) == "digits: 1438 train / 359 val samples, 10 classes, input (1, 8, 8)"
    x, y = a.val[0]
    assert x.shape == (1, 8, 8) and 0 <= float(x.min()) and float(x.max()) <= 1 and y.dtype == torch.int64
    assert torch.equal(a.val[10][0], b.val[10][0])  # the split does not move with the seed
    assert sorted({int(a.train[i][1]) for i in range(len(a.train))}) == list(range(10))


def test_digits_are_scikit_learns_without_importing_it():
    """The arrays read from scikit-learn's shipped CSV equal load_digits'; a fresh process that
    loads them imports no scikit-learn (about 3 CPU-seconds in every digits run)."""
    import subprocess
    import sys

    import numpy as np
    from sklearn.datasets import load_digits

    from guide_utils.data.arrays import digits_arrays

    images, target = digits_arrays()
    d = load_digits()
    assert np.array_equal(images, d.images) and np.array_equal(target, d.target)
    probe = ("import sys; from guide_utils.data.loaders import build_data; build_data('digits'); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("spec", ["mnist1d", "digits"])
def test_the_tensorflow_doors_arrays_are_the_pytorch_engines_samples(spec, tmp_path):
    """data.arrays gives TensorFlow the samples and split that build_data gives PyTorch,
    channels last; for MNIST-1D (the smoke profile's data) a fresh process loading them
    imports no torch (2.5 CPU-seconds and 0.6 GiB resident in every TensorFlow worker)."""
    import subprocess
    import sys

    from guide_utils.data.arrays import arrays

    bundle = build_data(spec, mnist1d_samples=400, cache_dir=tmp_path)
    xt, yt, xv, yv = arrays(spec, mnist1d_samples=400, cache_dir=tmp_path)
    for (x, y), dataset in (((xt, yt), bundle.train), ((xv, yv), bundle.val)):
        tx, ty = dataset.tensors
        assert torch.equal(torch.as_tensor(x), tx.movedim(1, -1)) and torch.equal(torch.as_tensor(y), ty)
    if spec == "mnist1d":
        probe = (f"import sys; from guide_utils.data.arrays import arrays; arrays('mnist1d', mnist1d_samples=400, "
                 f"cache_dir={str(tmp_path)!r}); print('torch' in sys.modules)")
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "False"


def test_image_folder_with_the_thesis_transforms(tmp_path):
    bundle = build_data(str(make_image_tree(tmp_path / "imgs")), image_size=32)
    assert bundle.num_classes == 2 and bundle.input_shape == (3, 32, 32)
    assert bundle.train[0][0].shape == (3, 32, 32) and bundle.val[0][0].shape == (3, 32, 32)


@pytest.mark.parametrize("make, fragment", [
    (lambda p: p / "missing", "does not exist"),
    (lambda p: (p / "f.txt").write_text("x") and p / "f.txt", "not a directory"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "no train/"),
    (lambda p: make_image_tree(p / "t", splits=("train",)), "no val/"),
    (lambda p: [(p / "c" / s).mkdir(parents=True) for s in ("train", "val")] and p / "c", "no class folders"),
])
def test_image_folder_errors(tmp_path, make, fragment):
    path = make(tmp_path)
    with pytest.raises(GuideError, match=fragment) as exc:
        build_data(str(path), image_size=32)
    assert "\n" not in str(exc.value) and str(path) in str(exc.value)


def test_too_few_mnist1d_samples_are_refused_by_both_engines_data_before_any_file_is_made(tmp_path):
    from guide_utils.data.arrays import arrays

    for load in (build_data, arrays):
        with pytest.raises(GuideError, match="--mnist1d-samples must be at least 100, got 99"):
            load("mnist1d", mnist1d_samples=99, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_mismatched_classes(tmp_path):
    root = make_image_tree(tmp_path / "d")
    (root / "val" / "cat").rename(root / "val" / "cow")
    with pytest.raises(GuideError, match="different classes"):
        build_data(str(root))


def test_models_by_name():
    assert sum(p.numel() for p in build_model("resnet50", num_classes=1000, input_shape=(3, 224, 224)).parameters()) \
        == 25_557_032  # torchvision's ResNet-50
    small = build_model("small_resnet", num_classes=10, input_shape=(3, 32, 32))
    out = small(torch.randn(8, 3, 32, 32))
    out.sum().backward()
    assert out.shape == (8, 10)
    assert build_model("mnist1d_cnn", num_classes=10, input_shape=(1, 40))(torch.randn(4, 1, 40)).shape == (4, 10)


@pytest.mark.parametrize("name, shape, fragment", [
    ("resnet5000", (3, 32, 32), "unknown model 'resnet5000'"),
    ("mnist1d_cnn", (3, 32, 32), "--data mnist1d"),
    ("small_resnet", (1, 40), "mnist1d_cnn"),
    ("resnet18", (1, 40), "mnist1d_cnn"),
    ("resnet18", (1, 8, 8), "small_resnet"),
])
def test_model_errors_are_one_line(name, shape, fragment):
    with pytest.raises(GuideError, match=fragment) as exc:
        build_model(name, num_classes=10, input_shape=shape)
    assert "\n" not in str(exc.value)
