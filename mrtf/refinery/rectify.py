"""Rectified distillation (MrTF Sect. 4.2, Eq. 10): entropy weights, u_t, rectified targets."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: u_t when no local model reported its training loss (documented fallback; a note says so).
U_FALLBACK = 0.5


def entropy(probs: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """e(x) = -Σ_c q_c log q_c over the last axis: (..., C) → (...), float64."""
    p = probs.astype(np.float64)
    return -(p * np.log(np.clip(p, eps, 1.0))).sum(-1)


def entropy_weights(probs: np.ndarray, variant: str = "paper") -> np.ndarray:
    """Per-sample model weights of Eq. 10: w_k(x) = softmax_k(-e_k(x)), probs (K, M, C) → (K, M).

    ``variant='reference'`` divides the entropy by C first (the authors' code), which makes the
    weights almost uniform.
    """
    e = entropy(probs)
    if variant == "reference":
        e = e / probs.shape[-1]
    z = -e - (-e).max(0, keepdims=True)
    w = np.exp(z)
    return w / w.sum(0, keepdims=True)


def u_t(train_losses: Sequence[float | None] | None, num_classes: int,
        fallback: float = U_FALLBACK) -> float:
    """u_t = 0.25 + 0.75 · mean_k(L_{t,k}) / log C, clipped to [0, 1] (Sect. 4.2).

    Losses that are None or not finite are ignored; when none is left, ``fallback`` (0.5: equal
    trust in the local ensemble and the self-teachers) is returned.
    """
    vals = [float(v) for v in (train_losses or []) if v is not None and math.isfinite(v)]
    if not vals:
        return float(fallback)
    u = 0.25 + 0.75 * float(np.mean(vals)) / math.log(num_classes)
    return float(min(1.0, max(0.0, u)))


def rectified_targets(local_probs: np.ndarray, start_probs: np.ndarray,
                      agg_probs: np.ndarray, u: float, variant: str = "paper") -> np.ndarray:
    """Eq. 10: u · Σ_k w̃_k(x) q_k + (1-u)/2 · (q_g(θ_t) + q_g(θ_{t+1})), → (M, C) float32.

    local_probs (K, M, C), start_probs / agg_probs (M, C): all stabilized (Eq. 6).
    'paper': w̃_k = softmax_k(-e_k) over the K local models (sums to 1), so the result is a
    distribution. 'reference' (authors' code): weights softmax(-e/C) over all K + 2 models
    (θ_t and θ_{t+1} included), multiplied by u/K (local) or (1-u)/2 (global) and not
    renormalised, so rows sum to less than 1.
    """
    if variant == "reference":
        allp = np.concatenate([local_probs, start_probs[None], agg_probs[None]])
        w = entropy_weights(allp, "reference")
        k = local_probs.shape[0]
        scale = np.array([u / k] * k + [(1 - u) / 2] * 2)[:, None]
        return np.einsum("km,kmc->mc", scale * w, allp).astype(np.float32)
    w = entropy_weights(local_probs, "paper")
    local = np.einsum("km,kmc->mc", w, local_probs.astype(np.float64, copy=False))
    glob = start_probs.astype(np.float64) + agg_probs.astype(np.float64)
    return (u * local + (1 - u) / 2 * glob).astype(np.float32)
