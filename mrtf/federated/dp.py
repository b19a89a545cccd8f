"""Differential privacy on the uploads (MrTF Sect. 5.5): each client's update clipped to
``dp_clip`` in L2 norm, then N(0, σ²) noise on every coordinate, before the server sees it."""

from __future__ import annotations

import math

import torch


def privatize(start: dict[str, torch.Tensor], state: dict[str, torch.Tensor], sigma: float,
              clip: float, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """θ_t + clip(θ_k − θ_t) + N(0, σ²): the update (all floating-point entries, BN statistics
    included) is scaled to L2 norm ≤ ``clip`` (when > 0), then Gaussian noise is added to every
    coordinate (MrTF Sect. 5.5). Integer buffers are passed through."""
    keys = [k for k, v in state.items() if v.is_floating_point()]
    delta = {k: state[k].double() - start[k].double() for k in keys}
    scale = 1.0
    if clip > 0:
        norm = math.sqrt(sum(float((d * d).sum()) for d in delta.values()))
        scale = min(1.0, clip / norm) if norm > 0 else 1.0
    out = dict(state)
    for k in keys:
        noise = torch.randn(delta[k].shape, generator=gen, dtype=torch.float64) * sigma \
            if sigma > 0 else 0.0
        out[k] = (start[k].double() + delta[k] * scale + noise).to(state[k].dtype)
    return out


