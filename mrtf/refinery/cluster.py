"""Clustered label refinery (MrTF Sect. 4.3, Eq. 11-12), nearest prototypes with faiss."""

from __future__ import annotations

import numpy as np

VARIANTS = ("paper", "reference")
_MASS_EPS = 1e-6


def prototypes(targets: np.ndarray, features: np.ndarray, chunk: int = 8192
               ) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 11: v_c = Σ_x q_c(x) h(x) / Σ_x q_c(x).

    targets (M, C), features (M, D) → (prototypes (C, D) float64, mass (C,) float64),
    accumulated in float64 over chunks of ``chunk`` rows (no float64 copy of all features).
    A class with mass ≤ 1e-6 gets a zero prototype (it is excluded downstream).
    """
    mass = targets.astype(np.float64).sum(0)
    protos = np.zeros((targets.shape[1], features.shape[1]), dtype=np.float64)
    for s in range(0, len(targets), chunk):
        protos += targets[s:s + chunk].astype(np.float64).T @ \
            features[s:s + chunk].astype(np.float64)
    ok = mass > _MASS_EPS
    protos[ok] /= mass[ok, None]
    protos[~ok] = 0.0
    return protos, mass


def _normalise(a: np.ndarray) -> np.ndarray:
    return a / (np.linalg.norm(a, axis=-1, keepdims=True) + 1e-12)


def _scale(tau: float, variant: str) -> tuple[float, float]:
    """Logit = a · cos + b. paper: -τ(1 - cos); reference: -4(2 - 2cos) = 8cos - 8."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    return (tau, -tau) if variant == "paper" else (8.0, -8.0)


def _softmax_masked(logits: np.ndarray, ok: np.ndarray) -> np.ndarray:
    z = np.where(ok[None], logits, -np.inf)
    z = z - z.max(1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(1, keepdims=True)).astype(np.float32)


def _feature_basis(features: np.ndarray, variant: str, dtype=np.float64) -> np.ndarray:
    """Features used for prototypes: raw (paper, Eq. 11) or L2-normalised (reference)."""
    f = features.astype(dtype, copy=False)
    return _normalise(f).astype(dtype, copy=False) if variant == "reference" else f


def prototype_targets_dense(targets: np.ndarray, features: np.ndarray, tau: float = 4.0,
                            iterations: int = 1, variant: str = "paper") -> np.ndarray:
    """Eq. 12 in plain numpy: q(y|x) = softmax_c(-τ · (1 - cos(h(x), v_c))), (M, C) float32.

    Classes without mass are excluded (probability 0). ``iterations`` repeats Eq. 11-12.
    Reference implementation for testing :func:`prototype_targets`; memory O(M·C).
    """
    a, b = _scale(tau, variant)
    f = _feature_basis(features, variant)
    fn = _normalise(f)
    q = targets
    for _ in range(iterations):
        protos, mass = prototypes(q, f)
        q = _softmax_masked(a * (fn @ _normalise(protos).T) + b, mass > _MASS_EPS)
    return q


def _faiss_index(dim: int, use_gpu: bool):
    import faiss

    index = faiss.IndexFlatIP(dim)
    if use_gpu and hasattr(faiss, "StandardGpuResources"):
        index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
    return index


def prototype_targets(targets: np.ndarray, features: np.ndarray, tau: float = 4.0,
                      iterations: int = 1, variant: str = "paper", chunk: int = 8192,
                      use_gpu: bool = False) -> np.ndarray:
    """Eq. 11-12 with faiss: IndexFlatIP over the L2-normalised prototypes of the classes that
    have mass; every sample's L2-normalised feature searches all of them (cosines), in chunks of
    ``chunk`` rows. targets (M, C), features (M, D) → (M, C) float32; excluded classes get 0.

    'paper': softmax(-τ(1 - cos)) on raw features' prototypes; 'reference': prototypes of
    L2-normalised features and softmax(-4 · (2 - 2cos)). GPU faiss when ``use_gpu`` and present.
    """
    a, b = _scale(tau, variant)
    f = _feature_basis(features, variant, np.float32)  # float32: one (M, D) copy at most
    m, c = targets.shape
    q = targets
    for _ in range(iterations):
        protos, mass = prototypes(q, f)
        keep = np.flatnonzero(mass > _MASS_EPS)
        index = _faiss_index(f.shape[1], use_gpu)
        index.add(np.ascontiguousarray(_normalise(protos[keep]).astype(np.float32)))
        out = np.empty((m, c), dtype=np.float32)
        ok = np.zeros(c, dtype=bool)
        ok[keep] = True
        for s in range(0, m, chunk):
            # normalised a chunk at a time: no second (M, D) array
            fn = f[s:s + chunk] if variant == "reference" else \
                _normalise(f[s:s + chunk]).astype(np.float32, copy=False)
            sims, idx = index.search(np.ascontiguousarray(fn), len(keep))
            cos = np.zeros((len(sims), c), dtype=np.float64)
            np.put_along_axis(cos, keep[idx], sims.astype(np.float64), axis=1)
            out[s:s + chunk] = _softmax_masked(a * cos + b, ok)
        q = out
    return q


def kmeans_view(features: np.ndarray, n_clusters: int, seed: int = 0, iterations: int = 25
                ) -> np.ndarray:
    """One-hot spherical k-means assignments (M, n) of L2-normalised ``features`` (faiss).

    A view of the target set that no received model chose: the consensus (consensus.py) learns
    from the data how well these clusters follow the classes. ``n_clusters`` is capped at M.
    Deterministic given ``seed`` (and the thread count).
    """
    import faiss

    f = np.ascontiguousarray(_normalise(features.astype(np.float32)), dtype=np.float32)
    n = max(1, min(n_clusters, len(f)))
    km = faiss.Kmeans(f.shape[1], n, niter=iterations, seed=seed, spherical=True,
                      verbose=False, min_points_per_centroid=1)
    km.train(f)
    _, assign = km.index.search(f, 1)
    view = np.zeros((len(f), n), dtype=np.float32)
    view[np.arange(len(f)), assign[:, 0]] = 1.0
    return view
