"""Small data sets, no downloads: `TensorDataset`s of (float32 features, int64 labels).
`digits()` is scikit-learn's bundled 8x8 handwritten digits (UCI ML hand-written digits,
Alpaydin & Kaynak 1998), scaled to [0, 1]; `synthetic()` seeded Gaussian blobs."""

from __future__ import annotations

import functools

import torch
from torch.utils.data import TensorDataset

from syncedu.comm.runs import check_int, check_number


def digits(images: bool = False) -> TensorDataset:
    """The 8x8 digits: features (1797, 64), or (1797, 1, 8, 8) with `images=True`.

    Read from scikit-learn's bundled `digits.csv.gz` (64 pixels and the label per row)
    without importing scikit-learn: the import costs about 1.5 s of CPU, in every rank
    process that loads the data, and the file 0.05 s. `load_digits()` if the file moved.
    """
    import importlib.util
    from pathlib import Path

    import numpy as np

    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    csv = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec else None
    if csv is not None and csv.is_file():
        table = np.loadtxt(csv, delimiter=",")
        pixels, labels = table[:, :-1], table[:, -1].astype(np.int64)
    else:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        pixels, labels = bunch.data, bunch.target
    x = torch.tensor(pixels, dtype=torch.float32) / 16.0
    y = torch.tensor(labels, dtype=torch.int64)
    if images:
        x = x.view(-1, 1, 8, 8)
    return TensorDataset(x, y)


@functools.cache
def digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """`digits()`'s (features, labels), read once per process and shared: never write to them
    (the parameter-server and fault-tolerance runs index them)."""
    return digits().tensors


def synthetic(n: int = 1024, features: int = 16, classes: int = 4, *, noise: float = 1.0,
              seed: int = 0) -> TensorDataset:
    """`n` points around `classes` random centres in `features` dimensions (seeded)."""
    for name, value, low in (("n", n, 1), ("features", features, 1), ("classes", classes, 2)):
        check_int(name, value, low)
    check_number("noise", noise, 0)
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=g) * 2.0
    y = torch.randint(0, classes, (n,), generator=g)
    x = centres[y] + noise * torch.randn(n, features, generator=g)
    return TensorDataset(x, y)


def holdout_split(dataset: TensorDataset, holdout: int, seed: int = 0):
    """(train, test) TensorDatasets: `holdout` samples drawn by a seeded permutation are the
    test set, the rest the training set (`holdout=0`: the whole dataset is both)."""
    if check_int("holdout", holdout, 0) >= len(dataset):
        raise ValueError(f"holdout={holdout!r} must be < the dataset's size {len(dataset)}")
    if holdout == 0:
        return dataset, dataset
    x, y = dataset.tensors
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    test, train = perm[:holdout], perm[holdout:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])
