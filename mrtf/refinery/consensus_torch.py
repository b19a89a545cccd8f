"""The adaptive consensus' Dawid-Skene EM (consensus.py) on the refine's device (issue 36).

:func:`em_on` is what the consensus calls: on the CPU it is :func:`consensus.em` itself (numpy,
float64: the default's labels do not move); on another device (CUDA) it is :func:`em_torch`,
the same EM in torch, float64, with every view's votes moved to the device once.

What differs on the device is only the order of the sums over M (one GEMM over all rows
against numpy's blocks; cuBLAS's own order): posteriors agree to ~1e-12 on the CPU's torch
(tests/refinery/test_consensus_torch.py holds them to 1e-9) and the EM may stop one step
earlier or later where a step moves the posterior by almost exactly ``tol``.

Device memory: every view (M, A_v) float64 at once, 8 · M · Σ_v A_v bytes (1M rows, 12
sources × 10 classes and a 20-cluster view: 1.1 GB).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mrtf.device import pick_device
from mrtf.refinery.consensus import Consensus, Votes, em


def em_on(votes: Votes, post: np.ndarray, weights: Sequence[float],
          device: str | torch.device | None = None) -> Consensus:
    """:func:`consensus.em` on ``device`` (None: CUDA when present): numpy on the CPU, else
    :func:`em_torch`. ``post`` holds the start and is updated in place either way."""
    dev = pick_device(device)
    if dev.type == "cpu":
        return em(votes, post, weights)
    return em_torch(votes, post, weights, dev)


def _confusions(cross: list[torch.Tensor], smoothing: float) -> list[torch.Tensor]:
    """consensus.confusions: π_v[c, a] ∝ Σ_x T(x, c) V_v(x, a) + α / A_v."""
    out = []
    for pv in cross:
        pi = pv + smoothing / pv.shape[1]
        out.append(pi / pi.sum(1, keepdim=True))
    return out


def em_torch(votes: Votes, post: np.ndarray, weights: Sequence[float],
             device: str | torch.device, iterations: int = 30, smoothing: float = 1.0,
             tol: float = 1e-6) -> Consensus:
    """:func:`consensus.em` in torch on ``device``, float64: the same E- and M-steps (the
    consensus.py docstring) and the same stop (no posterior moves more than ``tol``, or
    ``iterations`` steps). ``post`` (M, C) float64 holds the normalised start and receives
    the final posterior in place (the returned Consensus' posterior, on the host)."""
    dev = torch.device(device)
    m = len(post)
    views = votes.on_device(dev)
    w = [float(x) for x in weights]
    p = torch.from_numpy(np.ascontiguousarray(post, np.float64)).to(dev)
    mass, cross = p.sum(0), [p.T @ v for v in views]
    pis: list[torch.Tensor] = []
    done, loglik = 0, float("-inf")
    while done < iterations:
        done += 1
        prior = mass + 1e-6
        prior = prior / prior.sum()
        pis = _confusions(cross, smoothing)
        log_t = torch.log(prior).expand(m, -1).clone()
        for v, pi, lam in zip(views, pis, w):
            if lam:
                log_t += lam * (v @ torch.log(pi).T)
        top = log_t.max(1, keepdim=True).values
        new = torch.exp(log_t - top)
        norm = new.sum(1, keepdim=True)
        loglik = float((top + torch.log(norm)).sum())
        new = new / norm
        moved = float((new - p).abs().max()) if m else 0.0
        p = new
        mass, cross = p.sum(0), [p.T @ v for v in views]
        if moved < tol:
            break
    post[...] = p.cpu().numpy()
    prior = (mass + 1e-6).cpu().numpy()
    return Consensus(post, prior / prior.sum(), [pi.cpu().numpy() for pi in pis], done, loglik)
