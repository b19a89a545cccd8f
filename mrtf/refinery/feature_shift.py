"""How far the target's features are from the parties' own, read from their weights: every
BatchNorm layer carries the running mean and variance of its input over the party's training
data (its source statistics), so a model with BatchNorm says what its data looked like without
any claim. The target's per-channel mean and variance at the same layer, beside them: the
symmetric KL divergence between the two Gaussians (below), averaged over the channels and
then the layers; the median over the parties (one party's weights cannot flip it).

    SKL(N_s, N_t) = ½ (σ_s²/σ_t² + σ_t²/σ_s² − 2) + ½ (μ_t − μ_s)² (1/σ_s² + 1/σ_t²)

The target's statistics are read with dropout on (BatchNorm reading, not updating), as the
parties trained: a running variance collected under dropout is larger than the same data's
variance without it (SHOT's digit network, ``lenet_shot``, drops half its conv channels before
its BatchNorm: read without dropout, in-domain targets gave 0.08-0.43, as much as new domains).

Measured (bench/studies/feature_shift.py, docs/benchmarks/novelty.md; ``lenet_shot`` parties,
2,048 target rows): in-domain, the standard-digits parties (SHOT's recipe) on their own source
test set 0.003-0.117 and five mnist5k parties from one start on the mnist5k target 0.023-0.175
(IID shards and one party 0.003-0.034, Dirichlet 0.5 0.029-0.103, Dirichlet 0.1 0.068-0.175:
their statistics hold a few classes each, so label skew reads as shift too; novelty.py reads
the shift only where the parties agree); the user CNN of bench/models/mynet.py on mnist5k
Dirichlet shards 0.018-0.022; new domains: USPS → MNIST 0.121-0.378, MNIST → USPS 0.127-0.594,
MNIST → MNIST-M 0.548-0.935. Models without BatchNorm give no reading (None).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

from mrtf.refinery.placement import lent
from mrtf.trust.neighbours import reference_rows

#: target rows read (evenly spaced over the set): a channel's mean and variance are known to a
#: few percent from 2,048 samples; ten ``lenet_shot`` parties read them in 9 s on the loaded
#: 2-core machine (load 5, one thread), against 31 s for their logits on 10,000 rows
MAX_SAMPLES = 2048
#: SKL (nats) above which the parties' features count as shifted on the target: between the
#: in-domain readings where the parties agree on ≥ 0.3 of the target (≤ 0.103) and the
#: USPS → MNIST IID parties' 0.160 (novelty.py says where it is read)
FEATURE_SHIFT = 0.13


def batchnorms(model: nn.Module) -> list[_BatchNorm]:
    """The model's BatchNorm layers that carry running statistics (the parties' source
    statistics), in module order."""
    return [m for m in model.modules() if isinstance(m, _BatchNorm)
            and m.track_running_stats and m.running_mean is not None
            and m.running_var is not None]


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
        """Per channel, KL(N_s || N_t) + KL(N_t || N_s) between the two Gaussians (nats); a
        negative running variance (the weights are untrusted) counts as 0."""
        vs, vt = np.maximum(self.source_var, 0.0) + self.eps, self.target_var + self.eps
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
    """Each BatchNorm layer's :class:`LayerShift` over the target ``blocks`` (BatchNorm in eval
    mode: the running statistics are read, not updated; dropout on when ``dropout_on``, from
    ``seed``, the global generator left as it was); the model's outputs are appended to
    ``outputs`` when given. The model's modes are restored."""
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
    modes = {m: m.training for m in model.modules()}
    model.eval()
    if dropout_on:
        for m in model.modules():
            if isinstance(m, _DropoutNd):
                m.train()
    try:
        dev = torch.device(dev)
        cuda = [dev.index or 0] if dev.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=cuda):
            torch.manual_seed(seed)
            for x in blocks:
                out = model(torch.as_tensor(x, device=dev))
                if outputs is not None:
                    outputs.append(out.cpu().numpy())
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes.items():
            m.training = mode
    out = []
    for m, (s, ss, n) in zip(layers, sums, strict=True):
        mean = (s / n).cpu().numpy()
        var = np.maximum((ss / n).cpu().numpy() - mean ** 2, 0.0)
        out.append(LayerShift(mean, var, m.running_mean.detach().double().cpu().numpy(),
                              m.running_var.detach().double().cpu().numpy(), float(m.eps)))
    return out


@dataclass(frozen=True)
class FeatureShift:
    """per_party: each party's SKL (mean over its BatchNorm layers of the channels' mean);
    shift: their median, None when some party has no BatchNorm (no reading); shifted: shift >
    threshold."""

    per_party: tuple[float | None, ...]
    shift: float | None
    threshold: float = FEATURE_SHIFT

    @property
    def shifted(self) -> bool:
        return self.shift is not None and self.shift > self.threshold


def model_shift(model: nn.Module, x: np.ndarray, dev: torch.device | str = "cpu",
                block: int = 512) -> float | None:
    """One model's SKL on target rows ``x`` (dropout on, seed 0); None without BatchNorm;
    inf where it is not a number (running statistics that are NaN describe no data: as far
    from the target as can be, and one such party cannot move the median)."""
    if not batchnorms(model):
        return None
    with lent([model], torch.device(dev)):  # on the device for the pass, then back (placement)
        layers = layer_shifts(model, [x[s:s + block] for s in range(0, len(x), block)], dev,
                              dropout_on=True)
    value = float(np.mean([ls.symmetric_kl().mean() for ls in layers]))
    return value if np.isfinite(value) else float("inf")


def feature_shift(models: Sequence[nn.Module], source, dev: torch.device | str = "cpu",
                  threshold: float = FEATURE_SHIFT,
                  max_samples: int = MAX_SAMPLES) -> FeatureShift:
    """The parties' :class:`FeatureShift` on ``source`` (anything with ``len`` and ``take``:
    H5Dataset, ArraySource), read on up to ``max_samples`` evenly spaced rows; no reading when
    any model lacks BatchNorm (then none is run). y is never read."""
    if not models or not all(batchnorms(m) for m in models):
        return FeatureShift(tuple(None for _ in models), None, threshold)
    x = np.asarray(source.take(reference_rows(len(source), max_samples)), dtype=np.float32)
    per = tuple(model_shift(m, x, dev) for m in models)
    return FeatureShift(per, float(np.median(per)), threshold)
