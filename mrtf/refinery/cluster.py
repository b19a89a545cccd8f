"""Clustered label refinery (MrTF Sect. 4.3, Eq. 11-12), nearest prototypes with faiss."""

from __future__ import annotations

from contextlib import AbstractContextManager

import numpy as np

from mrtf.compute.backend import Backend, choose_backend, gpu_backend
from mrtf.refinery import cluster_torch
from mrtf.refinery.variants import VARIANTS

_MASS_EPS = 1e-6


def prototypes(targets: np.ndarray, features: np.ndarray, chunk: int = 8192,
               basis=None) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 11: v_c = Σ_x q_c(x) h(x) / Σ_x q_c(x).

    targets (M, C), features (M, D) → (prototypes (C, D) float64, mass (C,) float64),
    accumulated in float64 over chunks of ``chunk`` rows (no float64 copy of all features).
    ``features`` may be any array read by row slices (a spill.SpillArray); ``basis`` maps a
    chunk of rows to the features used (row-wise, e.g. L2 normalisation).
    A class with mass ≤ 1e-6 gets a zero prototype (it is excluded downstream).
    """
    mass = targets.astype(np.float64).sum(0)
    protos = None  # its width is the basis' (which may add columns), known at the first chunk
    for s in range(0, len(targets), chunk):
        f = features[s:s + chunk]
        f = f if basis is None else basis(f)
        part = targets[s:s + chunk].astype(np.float64).T @ f.astype(np.float64)
        protos = part if protos is None else protos + part
    if protos is None:
        protos = np.zeros((targets.shape[1], features.shape[1]), dtype=np.float64)
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


FLAT_MAX_ROWS = 200_000  # 'auto' index: exact flat search up to here, IVF above
INDEX_KINDS = ("auto", "flat", "ivf")


def faiss_index(database: np.ndarray, kind: str = "auto", seed: int = 0, use_gpu: bool = False,
                nprobe: int | None = None):
    """An inner-product faiss index holding ``database`` (N, D) float32.

    'auto' is a flat (exact) index up to ``FLAT_MAX_ROWS`` rows and an IVF index above: a
    flat search of M queries costs M·N·D, which is what makes N ≥ 200k slow; IVF with
    ``nlist = 4·√N`` lists searches ``nprobe`` of them (default nlist / 8). The IVF quantizer is
    trained on at most 256 rows per list drawn with ``seed``, so the index is deterministic given
    the seed. With ``nprobe = nlist`` IVF is exact. GPU faiss when ``use_gpu`` and present.
    """
    import faiss

    if kind not in INDEX_KINDS:
        raise ValueError(f"index kind must be one of {INDEX_KINDS}, got {kind!r}")
    n, dim = database.shape
    x = np.ascontiguousarray(database, dtype=np.float32)
    if kind == "flat" or (kind == "auto" and n <= FLAT_MAX_ROWS):
        index = faiss.IndexFlatIP(dim)
    else:
        nlist = max(1, min(n, int(4 * np.sqrt(n))))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist,
                                   faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = seed
        rows = np.random.default_rng(seed).permutation(n)[: 256 * nlist]
        index.train(x[np.sort(rows)])
        index.nprobe = nprobe or max(1, nlist // 8)
    if use_gpu and hasattr(faiss, "StandardGpuResources"):
        index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
    index.add(x)
    return index


def _cosines(fn: np.ndarray, protos_n: np.ndarray, index) -> np.ndarray:
    """(B, P) cosines of normalised rows with all P normalised prototypes, float64.

    With no (GPU) index, one float32 GEMM: searching all of a tiny flat index gives the same
    numbers plus a top-k sort, and faiss's OpenMP fork per chunk was ~30x slower than 1 thread
    on this loaded 2-core machine (100 ms vs 3 ms per 8,192 × 256 chunk against 10 prototypes,
    load 4.9), which made the search most of CLR's time at M = 1M.
    """
    if index is None:
        return (fn @ protos_n.T).astype(np.float64)
    sims, idx = index.search(np.ascontiguousarray(fn), len(protos_n))
    cos = np.zeros(sims.shape, dtype=np.float64)
    np.put_along_axis(cos, idx, sims.astype(np.float64), axis=1)
    return cos


def _one_blas_thread() -> AbstractContextManager:
    """CLR's GEMMs are thin (8,192 × 256 by ≤ 256 columns per chunk): on this loaded 2-core
    machine OpenBLAS's 2-thread pool made prototype_targets at 100k × 256 take 4.7 s on the
    first call and 0.64 s on the next, against 0.15 s with 1 thread (same data, load ~6)."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(1, user_api="blas")


def prototype_targets(targets: np.ndarray, features: np.ndarray, tau: float = 4.0,
                      iterations: int = 1, variant: str = "paper", chunk: int = 8192,
                      use_gpu: bool = False, backend: Backend | None = None) -> np.ndarray:
    """Eq. 11-12: cosines of every sample's L2-normalised feature with the L2-normalised
    prototypes of the classes that have mass, in chunks of ``chunk`` rows. targets (M, C),
    features (M, D) → (M, C) float32; excluded classes get 0.

    'paper': softmax(-τ(1 - cos)) on raw features' prototypes; 'reference': prototypes of
    L2-normalised features and softmax(-4 · (2 - 2cos)). The C prototypes are searched
    exhaustively by one GEMM per chunk (:func:`_cosines`), on one BLAS thread
    (:func:`_one_blas_thread`); a GPU faiss flat index when ``use_gpu`` and faiss-gpu is present.
    At M = 1M × 256 this took 6.7 s against 10.3 s before (same run, load ~5; bench/scale.py).

    Where (mrtf.compute.backend): ``backend``, else with ``use_gpu`` the default device's
    (faiss-gpu, or on CUDA without it cluster_torch.py's torch twin: the same targets up to
    float summation order), else the CPU path above.
    """
    where = backend or gpu_backend(use_gpu)
    if where.name == "torch":
        return cluster_torch.prototype_targets(targets, features, _scale(tau, variant),
                                               iterations, variant, chunk, where.device)
    with _one_blas_thread():
        return _prototype_targets(targets, features, tau, iterations, variant, chunk,
                                  where.name == "faiss-gpu")


def _prototype_targets(targets: np.ndarray, features: np.ndarray, tau: float, iterations: int,
                       variant: str, chunk: int, use_gpu: bool) -> np.ndarray:
    a, b = _scale(tau, variant)
    # features are taken a chunk at a time (row-wise basis): no (M, D) copy, and they may
    # live on disk (the streaming refinery's spill)
    def basis(rows: np.ndarray) -> np.ndarray:
        return _feature_basis(rows, variant, np.float32)

    m, c = targets.shape
    q = targets
    for _ in range(iterations):
        protos, mass = prototypes(q, features, chunk, basis)
        keep = np.flatnonzero(mass > _MASS_EPS)
        protos_n = np.ascontiguousarray(_normalise(protos[keep]).astype(np.float32))
        index = faiss_index(protos_n, "flat", use_gpu=True) if use_gpu else None
        out = np.empty((m, c), dtype=np.float32)
        ok = np.zeros(c, dtype=bool)
        ok[keep] = True
        for s in range(0, m, chunk):
            # normalised a chunk at a time: no second (M, D) array
            f = basis(features[s:s + chunk])
            fn = f if variant == "reference" else _normalise(f).astype(np.float32, copy=False)
            cos = np.zeros((len(fn), c), dtype=np.float64)
            cos[:, keep] = _cosines(fn, protos_n, index)
            out[s:s + chunk] = _softmax_masked(a * cos + b, ok)
        q = out
    return q


GEMM_MAX_ROWS = 4096  # nearest(): a plain GEMM + argmax against databases this small


def normalised_f32(features: np.ndarray, chunk: int = 65_536) -> np.ndarray:
    """L2-normalised rows as one new float32 array, normalised a chunk at a time (one (M, D)
    copy instead of three: 1 GB instead of 3 GB at 1M × 256)."""
    out = np.empty(features.shape, dtype=np.float32)
    for s in range(0, len(features), chunk):
        out[s:s + chunk] = _normalise(features[s:s + chunk].astype(np.float32, copy=False))
    return out


def nearest(queries: np.ndarray, database: np.ndarray, kind: str = "auto", seed: int = 0,
            chunk: int = 8192, nprobe: int | None = None) -> np.ndarray:
    """Index (M,) int64 of the largest inner product in ``database`` for every query row.

    'auto': a float32 GEMM + argmax per chunk up to ``GEMM_MAX_ROWS`` database rows (k-means
    centroids, prototypes: faiss's OpenMP fork per search cost ~30x on this loaded 2-core
    machine, see :func:`_cosines`), else :func:`faiss_index` (flat ≤ 200k rows, IVF above).
    'flat' / 'ivf' force that faiss index (tests, benchmarks).
    """
    db = np.ascontiguousarray(database, dtype=np.float32)
    out = np.empty(len(queries), dtype=np.int64)
    index = None if kind == "auto" and len(db) <= GEMM_MAX_ROWS else \
        faiss_index(db, kind, seed, nprobe=nprobe)
    for s in range(0, len(queries), chunk):
        q = np.ascontiguousarray(queries[s:s + chunk], dtype=np.float32)
        out[s:s + chunk] = (q @ db.T).argmax(1) if index is None else index.search(q, 1)[1][:, 0]
    return out


def kmeans_view(features: np.ndarray, n_clusters: int, seed: int = 0, iterations: int = 25,
                max_points_per_centroid: int = 256, backend: Backend | None = None
                ) -> np.ndarray:
    """One-hot spherical k-means assignments (M, n) float32 of L2-normalised ``features``
    (:func:`kmeans_assign`).

    A view of the target set that no received model chose: the consensus (consensus.py) learns
    from the data how well these clusters follow the classes.
    """
    assign, n = kmeans_assign(features, n_clusters, seed, iterations, max_points_per_centroid,
                              backend=backend)
    return one_hot(assign, n)


def one_hot(assign: np.ndarray, n: int) -> np.ndarray:
    """(M,) cluster indices → (M, n) float32 one-hot rows."""
    view = np.zeros((len(assign), n), dtype=np.float32)
    view[np.arange(len(assign)), assign] = 1.0
    return view


def kmeans_assign(features, n_clusters: int, seed: int = 0, iterations: int = 25,
                  max_points_per_centroid: int = 256, block: int = 65_536,
                  backend: Backend | None = None) -> tuple[np.ndarray, int]:
    """Spherical k-means (faiss) of L2-normalised ``features`` (M, D): (assignments (M,)
    int64, number of clusters n = min(n_clusters, M)).

    Training uses at most ``max_points_per_centroid`` · n rows, drawn here with ``seed``
    (5,120 of 1M rows for 20 clusters), so ``features`` can be any array read by row slices
    (a spill.SpillArray: nothing (M, D) is held); every row is then assigned by
    :func:`nearest`, a block at a time. At 1M × 256 the view took 2.9-5.6 s (8.7 s before;
    load ~5; bench/scale.py). Deterministic given ``seed`` (and the thread count).

    ``backend`` (mrtf.compute.backend; None: 'auto', CUDA when present): 'faiss-cpu' as above;
    'faiss-gpu' trains with faiss on the GPU; 'torch' trains with mrtf.compute.kmeans (faiss's
    algorithm step for step: the same centroids up to float rounding); both assign every row
    on the device (cluster_torch.py).
    """
    import faiss

    where = backend or choose_backend(None)
    m, dim = features.shape[0], features.shape[1]
    n = max(1, min(n_clusters, m))
    cap = max_points_per_centroid * n
    if m > cap:
        rows = np.sort(np.random.default_rng(seed).choice(m, cap, replace=False))
        sample = features.take(rows) if hasattr(features, "take") and \
            not isinstance(features, np.ndarray) else features[rows]
    else:
        sample = features[0:m]
    if where.name == "torch":
        centroids = cluster_torch.kmeans_centroids(sample, n, iterations, seed, where.device)
        return cluster_torch.assign_nearest(features, centroids, block, where.device), n
    km = faiss.Kmeans(dim, n, niter=iterations, seed=seed, spherical=True, verbose=False,
                      min_points_per_centroid=1, max_points_per_centroid=max_points_per_centroid,
                      gpu=where.name == "faiss-gpu")
    km.train(normalised_f32(sample))
    if not where.on_host:
        return cluster_torch.assign_nearest(features, km.centroids, block, where.device), n
    assign = np.empty(m, dtype=np.int64)
    with _one_blas_thread():
        for s in range(0, m, block):
            assign[s:s + block] = nearest(normalised_f32(features[s:s + block]), km.centroids)
    return assign, n
