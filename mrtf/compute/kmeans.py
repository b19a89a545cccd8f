"""Spherical k-means in torch on any device, step for step faiss's ``Kmeans(spherical=True)``.

faiss's Clustering (faiss/Clustering.cpp, faiss 1.15) is reproduced, not only its algorithm:
the initial centroids are the training rows its ``rand_perm(n, seed + 1)`` puts first
(std::mt19937 seeded with the seed: numpy's legacy RandomState gives the same 32-bit draws),
each iteration assigns every row to its largest inner product, takes each cluster's mean,
splits a large cluster into any empty one as faiss does (its own RandomGenerator(1234) per
iteration, and a ±1/1024 perturbation), renormalises, and stops early where faiss does (an
objective, summed in float32 in row order, equal to the previous one). The cluster sums are
one product with the one-hot assignments (deterministic on CUDA, where index_add_ is not).
So on the same rows the centroids are faiss's up to float32 rounding (≤ 2.4e-7), except
where that rounding moves the early stop by an iteration while a cluster split between two
centroids still drifts: in 3 of 10 cases tried (6 × 12 blobs of 3,000 rows, 4 × 5,120
random rows), centroids 4e-4 to 2e-3 apart, and the assignments differed in one of them (14
of 3,000 rows). The training set is what the caller passes: faiss would subsample above 256
rows per cluster (cluster.kmeans_assign draws at most that many itself, so faiss never does
there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from mrtf.compute.knn import unit_rows
from mrtf.compute.lean_ops import one_hot

#: faiss's split perturbation: "a bit above machine epsilon for float16"
_SPLIT_EPS = 1 / 1024.0
_SPLIT_SEED = 1234


def faiss_permutation(n: int, seed: int) -> np.ndarray:
    """faiss's ``rand_perm(perm, n, seed)``: a Fisher-Yates shuffle drawing
    ``mt19937() % (n - i)`` (faiss/utils/random.cpp)."""
    draws = _mt_draws(seed, max(n - 1, 0))
    perm = np.arange(n, dtype=np.int64)
    for i in range(n - 1):
        j = i + int(draws[i] % (n - i))
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def _mt_draws(seed: int, count: int) -> np.ndarray:
    """The first ``count`` 32-bit outputs of std::mt19937(seed): RandomState's integer seeding
    is the same init_genrand, and a full 32-bit range returns the raw outputs."""
    rs = np.random.RandomState(seed & 0xFFFFFFFF)
    return rs.randint(0, 2**32, size=count, dtype=np.uint64)


class _SplitRandom:
    """faiss's ``RandomGenerator(1234).rand_float()``: mt19937() / float(mt.max()), float32."""

    def __init__(self) -> None:
        self._rs = np.random.RandomState(_SPLIT_SEED)

    def rand_float(self) -> np.float32:
        raw = self._rs.randint(0, 2**32, dtype=np.uint64)
        return np.float32(raw) / np.float32(0xFFFFFFFF)


@dataclass
class KMeansResult:
    """centroids (k, D) float32 on the device (unit rows); objective: Σ of each row's inner
    product with its centroid before every update (faiss's ``obj``, float32 in row order), one
    per iteration run; splits: empty clusters split per iteration."""

    centroids: torch.Tensor
    objective: list[float] = field(default_factory=list)
    splits: list[int] = field(default_factory=list)


def spherical_kmeans(x: torch.Tensor, k: int, iterations: int = 25, seed: int = 1234
                     ) -> KMeansResult:
    """k unit centroids of the rows of ``x`` (n, D) float32 (normalised by the caller, as faiss
    is given them), on x's device. n ≥ k (ValueError otherwise); n == k copies the rows."""
    n = len(x)
    if n < k:
        raise ValueError(f"k-means needs at least as many rows ({n}) as clusters ({k})")
    if n == k:  # faiss's corner case: the rows are the centroids, not renormalised
        return KMeansResult(x.clone(), [0.0], [0])
    # the k rows stacked, not indexed: CUDA's indexing kernels cost host memory
    # (compute/lean_ops.py); so do ``all`` and ``reciprocal`` below
    centroids = unit_rows(torch.stack([x[int(i)] for i in faiss_permutation(n, seed + 1)[:k]]))
    out = KMeansResult(centroids)
    for i in range(iterations):
        best = (x @ centroids.T).max(1)  # the first of tied centroids, as argmax
        assign = best.indices
        # faiss's objective: a float32 sum in row order, and faiss stops at the first
        # iteration whose objective equals the previous one (early_stop_threshold = 0)
        out.objective.append(float(np.cumsum(best.values.cpu().numpy(), dtype=np.float32)[-1]))
        # sums and counts by a product with the one-hot assignments: deterministic on CUDA,
        # where index_add_ / bincount accumulate atomically (in any order)
        member = one_hot(assign, k).to(x.dtype)
        sums, counts = member.T @ x, member.sum(0)
        inverse = torch.ones_like(counts) / counts.clamp_min(1)  # 1.0 / t: a reciprocal
        centroids = sums * torch.where(counts > 0, inverse, 0.0)[:, None]
        centroids, splits = _split_empty(centroids, counts, n)
        out.splits.append(splits)
        centroids = unit_rows(centroids)
        if i > 0 and out.objective[-1] == out.objective[-2]:
            break
    out.centroids = centroids
    return out


def _split_empty(centroids: torch.Tensor, counts: torch.Tensor, n: int
                 ) -> tuple[torch.Tensor, int]:
    """faiss's split_clusters: each empty cluster takes a copy of a cluster picked with
    probability (size - 1) / (n - k), both perturbed by ±1/1024 in alternate coordinates."""
    if bool(counts.amin() > 0):
        return centroids, 0
    c = centroids.cpu().numpy().copy()  # k rows: the loop is faiss's, on the host
    size = counts.cpu().numpy().astype(np.float32)
    k = len(c)
    rng = _SplitRandom()
    up = np.where(np.arange(c.shape[1]) % 2 == 0, 1 + _SPLIT_EPS, 1 - _SPLIT_EPS)
    up, down = up.astype(np.float32), (2 - up).astype(np.float32)
    splits = 0
    for ci in range(k):
        if size[ci] != 0:
            continue
        cj = 0
        while rng.rand_float() >= np.float32((size[cj] - 1.0) / np.float32(n - k)):
            cj = (cj + 1) % k
        c[ci] = c[cj] * up
        c[cj] = c[cj] * down
        size[ci] = size[cj] / 2
        size[cj] -= size[ci]
        splits += 1
    return torch.from_numpy(c).to(centroids.device), splits
