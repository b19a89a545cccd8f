"""How far the target's features are from the parties' own: BatchNorm's running statistics.

Draft (the study bench/studies/feature_shift.py reads it before the rule is chosen).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

#: target rows read (evenly spaced over the set): a channel's mean and variance are known to a
#: few percent from 2,048 samples, and 10 LeNets read them in about a second
MAX_SAMPLES = 2048


def batchnorms(model: nn.Module) -> list[_BatchNorm]:
    """The model's BatchNorm layers that carry running statistics (the parties' source
    statistics), in module order."""
    return [m for m in model.modules() if isinstance(m, _BatchNorm)
            and m.track_running_stats and m.running_mean is not None
            and m.running_var is not None]


def sample_rows(n: int, max_samples: int = MAX_SAMPLES) -> np.ndarray:
    """Up to ``max_samples`` row indices evenly spaced over ``n`` (sorted, distinct)."""
    if n <= max_samples:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, max_samples).round().astype(np.int64))


@dataclass(frozen=True)
class LayerShift:
    """One BatchNorm layer: the target's per-channel mean and variance of its input beside
    the running ones the model carries (float64, (C,) each)."""

    target_mean: np.ndarray
    target_var: np.ndarray
    source_mean: np.ndarray
    source_var: np.ndarray
    eps: float

    def symmetric_kl(self) -> np.ndarray:
        """Per channel, KL(N_s || N_t) + KL(N_t || N_s) between the two Gaussians (nats)."""
        vs, vt = self.source_var + self.eps, self.target_var + self.eps
        d2 = (self.target_mean - self.source_mean) ** 2
        return 0.5 * (vs / vt + vt / vs - 2.0) + 0.5 * d2 * (1.0 / vs + 1.0 / vt)

    def mean_shift(self) -> np.ndarray:
        """Per channel, |μ_t - μ_s| / σ_s: the target's mean in the source's standard units."""
        return np.abs(self.target_mean - self.source_mean) / np.sqrt(self.source_var + self.eps)

    def log_var_ratio(self) -> np.ndarray:
        return np.log((self.target_var + self.eps) / (self.source_var + self.eps))


def layer_shifts(model: nn.Module, blocks: Sequence[np.ndarray],
                 dev: torch.device | str = "cpu", outputs: list | None = None,
                 dropout_on: bool = False, seed: int = 0) -> list[LayerShift]:
    """Each BatchNorm layer's :class:`LayerShift` over the target ``blocks`` (model in eval
    mode, so the running statistics are read, not updated); the model's outputs are appended
    to ``outputs`` when given."""
    layers = batchnorms(model)
    sums: list[list] = [[0.0, 0.0, 0] for _ in layers]

    def hook(i):
        def record(_module, inputs, _output):
            h = inputs[0].detach().to(torch.float64)
            h = h.transpose(0, 1).reshape(h.shape[1], -1)  # (C, N·spatial)
            sums[i][0] = sums[i][0] + h.sum(1)
            sums[i][1] = sums[i][1] + (h * h).sum(1)
            sums[i][2] += h.shape[1]
        return record

    handles = [m.register_forward_hook(hook(i)) for i, m in enumerate(layers)]
    was_training = model.training
    model.eval()
    if dropout_on:
        for m in model.modules():
            if isinstance(m, _DropoutNd):
                m.train()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for x in blocks:
                out = model(torch.as_tensor(x, device=dev))
                if outputs is not None:
                    outputs.append(out.cpu().numpy())
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    out = []
    for m, (s, ss, n) in zip(layers, sums, strict=True):
        mean = (s / n).cpu().numpy()
        var = np.maximum((ss / n).cpu().numpy() - mean ** 2, 0.0)
        out.append(LayerShift(mean, var, m.running_mean.detach().double().cpu().numpy(),
                              m.running_var.detach().double().cpu().numpy(), float(m.eps)))
    return out

