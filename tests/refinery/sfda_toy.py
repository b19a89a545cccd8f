"""A deliberately shifted toy problem for the source-free adapters' tests: a small MLP trained on
half of scikit-learn's digits, the other half as the target with every pixel mapped
x ↦ 0.7·x + 0.15 (lower contrast, brighter): the source model gets about 75% of it.

Tests that train these tiny models for many small steps call ``torch.set_num_threads(1)`` first
(tests/conftest.py restores the suite's 2): two threads spin against each other on a loaded
machine, 10-40x slower here."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mrtf.data import load_builtin
from mrtf.io.hdf5 import ArraySource

CONTRAST, BRIGHTNESS = 0.7, 0.15


def shifted_digits() -> tuple[nn.Module, ArraySource, np.ndarray]:
    """(source model in eval mode, the shifted target without y, the target's y for scoring)."""
    ds = load_builtin("digits")
    x = ds.x.reshape(len(ds.x), -1).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    src, tgt = order[:900], order[900:]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    xs, ys = torch.from_numpy(x[src]), torch.from_numpy(ds.y[src]).long()
    for _ in range(300):
        opt.zero_grad()
        nn.functional.cross_entropy(model(xs), ys).backward()
        opt.step()
    target = (CONTRAST * x[tgt] + BRIGHTNESS).astype(np.float32)
    return model.eval(), ArraySource(target), ds.y[tgt]


def accuracy(model: nn.Module, source: ArraySource, y: np.ndarray) -> float:
    with torch.no_grad():
        return float((model(torch.from_numpy(source.x)).argmax(1).numpy() == y).mean())
