"""The clustered label refinery's steps (Eq. 11-12) and the k-means view in torch, on any
device: cluster.py's CPU path computed where the features can be moved (issue 36).

Same arithmetic as cluster.py, in the same precisions: the prototypes are accumulated in
float64 over chunks of rows (Eq. 11), each chunk's cosines with the normalised prototypes are
one float32 product, and the masked softmax (Eq. 12) is taken in float64; so the targets equal
the CPU path's up to the summation order of those products (≤ 1e-6 in the tests). The
features stay where they are (an array or a spill read by row slices): one chunk at a time
goes to the device. Nothing (M, D) is held on it.
"""

from __future__ import annotations

import numpy as np
import torch

from mrtf.compute.kmeans import spherical_kmeans
from mrtf.compute.knn import nearest_block, unit_rows

_MASS_EPS = 1e-6  # cluster._MASS_EPS: a class with no more mass is excluded


def _rows(a, s: int, chunk: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a[s:s + chunk])).to(device).to(dtype)


def _basis(f: torch.Tensor, variant: str) -> torch.Tensor:
    """cluster._feature_basis in float32: raw (paper) or L2-normalised (reference) features."""
    return unit_rows(f) if variant == "reference" else f


def prototypes(targets: np.ndarray, features, variant: str, chunk: int,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 11 on the device: (prototypes (C, D) float64, mass (C,) float64); a class with mass
    ≤ 1e-6 gets a zero prototype (cluster.prototypes)."""
    mass = torch.from_numpy(targets.astype(np.float64).sum(0)).to(device)
    protos = torch.zeros((targets.shape[1], features.shape[1]), dtype=torch.float64,
                         device=device)
    for s in range(0, len(targets), chunk):
        f = _basis(_rows(features, s, chunk, device, torch.float32), variant).double()
        protos += _rows(targets, s, chunk, device, torch.float64).T @ f
    ok = mass > _MASS_EPS
    protos = torch.where(ok[:, None], protos / mass.clamp_min(_MASS_EPS)[:, None], 0.0)
    return protos, mass


def prototype_targets(targets: np.ndarray, features, scale: tuple[float, float],
                      iterations: int, variant: str, chunk: int, device: torch.device
                      ) -> np.ndarray:
    """Eq. 11-12 as cluster.prototype_targets, on ``device``: (M, C) float32 on the host.
    ``scale`` (a, b): logit = a · cos + b (cluster._scale)."""
    a, b = scale
    m, c = targets.shape
    q = targets
    for _ in range(iterations):
        protos, mass = prototypes(q, features, variant, chunk, device)
        ok = mass > _MASS_EPS
        protos_n = unit_rows(protos[ok]).float()
        out = np.empty((m, c), dtype=np.float32)
        for s in range(0, m, chunk):
            # cluster.py: paper features are normalised in float32; reference ones already are
            f = _rows(features, s, chunk, device, torch.float32)
            fn = unit_rows(f)  # reference: its basis, normalised once
            cos = torch.zeros((len(fn), c), dtype=torch.float64, device=device)
            cos[:, ok] = (fn @ protos_n.T).double()
            z = torch.where(ok[None], a * cos + b, -float("inf"))
            out[s:s + chunk] = torch.softmax(z, 1).float().cpu().numpy()
        q = out
    return q


def kmeans_centroids(sample: np.ndarray, n: int, iterations: int, seed: int,
                     device: torch.device) -> torch.Tensor:
    """cluster.kmeans_assign's training on ``device``: spherical k-means (mrtf.compute.kmeans,
    step for step faiss's) of the L2-normalised ``sample`` rows → (n, D) float32 centroids."""
    x = unit_rows(torch.from_numpy(np.ascontiguousarray(sample, dtype=np.float32)).to(device))
    return spherical_kmeans(x, n, iterations, seed).centroids


def assign_nearest(features, centroids, block: int, device: torch.device) -> np.ndarray:
    """(M,) int64: each L2-normalised row's largest inner product among ``centroids`` (a
    tensor or an (n, D) array), ``block`` rows at a time on ``device``."""
    c = torch.as_tensor(centroids, dtype=torch.float32).to(device)
    assign = np.empty(len(features), dtype=np.int64)
    for s in range(0, len(features), block):
        f = unit_rows(_rows(features, s, block, device, torch.float32))
        assign[s:s + len(f)] = nearest_block(f, c).cpu().numpy()
    return assign
