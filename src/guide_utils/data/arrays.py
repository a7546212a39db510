"""The built-in real datasets as numpy arrays, without PyTorch.

MNIST-1D and scikit-learn's digits, read (or generated and cached) here for both engines:
``loaders`` wraps them in PyTorch datasets, and ``arrays`` hands them to the TensorFlow door
in channels-last layout. A TensorFlow worker that imported torch for its data would pay about
2.5 CPU-seconds and 0.6 GiB of resident memory for nothing, so torch is imported only where
the digits' split is drawn (with torch's generator, as every recorded run drew it).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from ..core.errors import GuideError

SYNTHETIC_MODES = {"synthetic": "synthetic-loader", "synthetic-loader": "synthetic-loader",
                   "synthetic-resident": "synthetic-resident"}


def _cache_dir(cache_dir: Path | None) -> Path:
    return Path(cache_dir or os.environ.get("GUIDE_DATA_CACHE") or Path.home() / ".cache" / "guide_utils")


def mnist1d_arrays(samples: int, seed: int, cache_dir: Path | None) -> dict[str, np.ndarray]:
    """MNIST-1D's ``x``, ``y``, ``x_test``, ``y_test`` for ``samples`` and ``seed``, from the cache
    (``GUIDE_DATA_CACHE``, else ~/.cache/guide_utils) or generated into it."""
    from importlib.metadata import version

    if samples < 100:
        raise GuideError(f"--mnist1d-samples must be at least 100, got {samples}")

    # Keyed by the installed mnist1d, which is imported only to generate: importing it
    # (matplotlib, scipy) costs each worker a CPU-second that a cache hit does not need.
    key = hashlib.sha256(f"{samples}-{seed}-{version('mnist1d')}".encode()).hexdigest()[:12]
    directory = _cache_dir(cache_dir)
    path = directory / f"mnist1d-{samples}-seed{seed}-{key}.npz"
    want = ("x", "y", "x_test", "y_test")
    if path.exists():
        try:
            with np.load(path) as f:
                arrays = {k: f[k] for k in want}
            if arrays["x"].shape[1:] == (40,) and len(arrays["x"]) == len(arrays["y"]):
                return arrays
        except Exception:  # noqa: BLE001 - any unreadable cache is regenerated
            pass
        warnings.warn(f"MNIST-1D cache {path} is unreadable; generating it again", stacklevel=3)
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = samples, seed
    # make_dataset prints progress; keep rank output clean.
    stdout, sys.stdout = sys.stdout, open(os.devnull, "w")
    try:
        data = make_dataset(args)
    finally:
        sys.stdout.close()
        sys.stdout = stdout
    arrays = {k: np.asarray(data[k]) for k in want}
    directory.mkdir(parents=True, exist_ok=True)
    # Atomic: several ranks may generate at once; each renames a complete file into place.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".mnist1d-", suffix=".npz")
    with os.fdopen(fd, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)
    return arrays


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: (1797, 8, 8) images with pixel values 0..16, and their labels;
    the arrays ``load_digits`` returns, read from the CSV file scikit-learn ships. Importing
    scikit-learn's datasets costs about 3 CPU-seconds, which every process that trains on
    digits would pay (the tests start hundreds)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    csv = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if csv is None or not csv.is_file():  # another layout: scikit-learn's own reader
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.images, d.target
    data = np.loadtxt(csv, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits as the engines train on them: ``(x, y, train, val)``, images (N, 8, 8) scaled to
    0..1 as float32, int64 labels, and a fixed 80/20 split by position (not the run's seed:
    every run validates on the same fifth), drawn with torch's generator seeded 0."""
    import torch

    images, target = digits_arrays()
    x = (images / 16.0).astype(np.float32)  # pixel values are 0..16
    order = torch.randperm(len(target), generator=torch.Generator().manual_seed(0)).numpy()
    n_val = len(target) // 5
    return x, target.astype(np.int64), order[n_val:], order[:n_val]


def arrays(spec: str, *, mnist1d_samples: int = 20000, seed: int = 0, cache_dir: Path | None = None):
    """The built-in real datasets as numpy arrays in channels-last layout, for frameworks
    other than PyTorch (the TensorFlow door): ``(x_train, y_train, x_val, y_val)``.

    Same samples and the same train/val split as ``build_data``: MNIST-1D as (N, 40, 1)
    signals, digits as (N, 8, 8, 1) images scaled to 0..1.
    """
    if spec == "mnist1d":
        a = mnist1d_arrays(mnist1d_samples, seed, cache_dir)
        return (a["x"][..., None].astype(np.float32), a["y"].astype(np.int64),
                a["x_test"][..., None].astype(np.float32), a["y_test"].astype(np.int64))
    if spec == "digits":
        x, y, train, val = digits_split()
        x = x[..., None]
        return x[train], y[train], x[val], y[val]
    raise GuideError(f"no array form of dataset {spec!r}; choose mnist1d or digits")
