"""The teachers' logit blocks read on a torch device (issue 36): row softmax, mean entropy,
label agreement, the stabilized softmax (Eq. 6) and its std.

On a GPU machine the 1M-row refine spent much of its time in numpy over the (K, M, C) logits
(elementwise ufuncs run on one core): the calibration's signals, the novelty's entropies and
Eq. 6's softmax (docs/benchmarks/gpu.md, 2026-11-26, has the profiles). These functions are
the same arithmetic in torch, float64, on the refine's device; their callers keep numpy on
the CPU (bit-identical to before) and call these elsewhere. What differs on CUDA is the last
bits of ``exp`` and the order of the sums over M (tests/compute/test_softmax_rows.py holds
them to numpy on the CPU's torch).

A block is moved in its stored dtype (float32: half the bytes of float64) and widened on the
device, which is exact.
"""

from __future__ import annotations

import numpy as np
import torch


def on_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """``a`` as a float64 tensor on ``device``, moved in its own dtype."""
    return torch.from_numpy(np.ascontiguousarray(a)).to(device).to(torch.float64)


def softmax64(z: torch.Tensor) -> torch.Tensor:
    """Row softmax over the last axis in z's dtype (teachers._softmax_np's formula)."""
    z = z - z.amax(-1, keepdim=True)
    e = torch.exp(z)
    return e / e.sum(-1, keepdim=True)


def entropy_sums(logits, k: int, rows: int, device: torch.device) -> np.ndarray:
    """Σ over the target of the entropy (nats) of softmax(logits), per model, (k,) float64
    (novelty.mean_entropies before its division by M); ``rows`` rows per block."""
    m = logits.shape[1]
    total = torch.zeros(k, dtype=torch.float64, device=device)
    for s in range(0, m, rows):
        z = on_device(logits[:k, s:s + rows], device)
        z = z - z.amax(2, keepdim=True)
        logp = z - torch.log(torch.exp(z).sum(2, keepdim=True))
        total += -(torch.exp(logp) * logp).sum((1, 2))
    return total.cpu().numpy()


def agreeing_pairs(logits, k: int, rows: int, device: torch.device) -> float:
    """Σ over rows and over pairs i < j of the first k models of [argmax_i = argmax_j]
    (novelty.mean_agreement before its division)."""
    same = torch.zeros((), dtype=torch.int64, device=device)
    for s in range(0, logits.shape[1], rows):
        labels = torch.from_numpy(np.ascontiguousarray(logits[:k, s:s + rows])).to(
            device).argmax(2)
        for i in range(k - 1):
            same += (labels[i + 1:] == labels[i]).sum()
    return float(same.item())


def stabilized_softmax(block: np.ndarray, tau: float, stds: np.ndarray,
                       device: torch.device) -> np.ndarray:
    """Eq. 6 for a block (K, m, C) float32 of logits: softmax(τ z_k / (std_k + 1e-8)) per
    teacher, float32 on the host, computed as ensemble.stabilized_blocks does in numpy
    (τ z in float32, then the float64 division and softmax)."""
    z = torch.from_numpy(np.ascontiguousarray(block)).to(device)
    scale = torch.as_tensor(np.asarray(stds, np.float64) + 1e-8, device=device)
    q = softmax64((tau * z).to(torch.float64) / scale[:, None, None])
    return q.to(torch.float32).cpu().numpy()


def teacher_stds(logits, rows: int, device: torch.device) -> np.ndarray:
    """teachers.global_stds on ``device``: each teacher's population std over all M samples
    and C classes, exact two passes in float64."""
    k, m, c = logits.shape
    sums = torch.zeros(k, dtype=torch.float64, device=device)
    for s in range(0, m, rows):
        sums += on_device(logits[:, s:s + rows], device).sum((1, 2))
    mean = sums / (m * c)
    sq = torch.zeros(k, dtype=torch.float64, device=device)
    for s in range(0, m, rows):
        # d * d, not torch.square: the same products (pow by 2 is a product), without the
        # power kernels' CUDA module (docs/gpu.md, "Host memory")
        d = on_device(logits[:, s:s + rows], device) - mean[:, None, None]
        sq += (d * d).sum((1, 2))
    return torch.sqrt(sq / (m * c)).cpu().numpy()
