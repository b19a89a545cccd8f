"""cluster.py at scale: index choice by size, IVF against flat, GEMM assignment, k-means view."""

import faiss
import numpy as np
import pytest

from mrtf.refinery.cluster import (
    FLAT_MAX_ROWS,
    faiss_index,
    kmeans_view,
    nearest,
    normalised_f32,
    prototype_targets,
    prototype_targets_dense,
)


def _blobs(m: int, d: int = 32, c: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((c, d)).astype(np.float32) * 3
    y = rng.integers(0, c, m)
    return normalised_f32(centers[y] + rng.standard_normal((m, d)).astype(np.float32)), y


def test_auto_index_is_flat_below_the_threshold():
    db, _ = _blobs(500)
    assert FLAT_MAX_ROWS == 200_000
    assert isinstance(faiss_index(db), faiss.IndexFlatIP)
    assert isinstance(faiss_index(db, "ivf"), faiss.IndexIVFFlat)
    with pytest.raises(ValueError):
        faiss_index(db, "hnsw")


def test_forced_ivf_matches_flat():
    db, _ = _blobs(4000, seed=1)
    q, _ = _blobs(1000, seed=2)
    flat = nearest(q, db, "flat")
    np.testing.assert_array_equal(nearest(q, db, "auto"), flat)  # the GEMM path
    nlist = faiss_index(db, "ivf").nlist
    np.testing.assert_array_equal(nearest(q, db, "ivf", nprobe=nlist), flat)  # all lists: exact
    approx = nearest(q, db, "ivf")
    sims = lambda idx: np.einsum("md,md->m", q, db[idx])  # noqa: E731
    assert np.mean(approx == flat) > 0.5
    assert np.mean(sims(flat) - sims(approx) < 0.05) > 0.95  # near-equal similarities
    np.testing.assert_array_equal(nearest(q, db, "ivf", seed=3), nearest(q, db, "ivf", seed=3))


def test_prototype_targets_match_dense_with_an_empty_class():
    f, y = _blobs(3000, c=5, seed=4)
    f = np.maximum(f, 0) + 0.01
    t = np.eye(6, dtype=np.float32)[y]  # class 5 has no mass
    for variant in ("paper", "reference"):
        got = prototype_targets(t, f, iterations=2, variant=variant, chunk=700)
        np.testing.assert_allclose(got, prototype_targets_dense(t, f, iterations=2,
                                                                variant=variant), atol=1e-5)
        assert (got[:, 5] == 0).all()


def test_kmeans_view_deterministic_and_follows_blobs():
    f, y = _blobs(5000, c=4, seed=5)
    a = kmeans_view(f * 7.0, 8, seed=0)
    np.testing.assert_array_equal(a, kmeans_view(f * 7.0, 8, seed=0))
    assert a.shape == (5000, 8) and (a.sum(1) == 1).all()
    purity = sum(np.bincount(y[a[:, j] == 1]).max() for j in range(8) if a[:, j].any())
    assert purity / len(y) > 0.95
    np.testing.assert_allclose(normalised_f32(f * 7.0), f, atol=1e-6)


def test_kmeans_and_clr_read_spilled_features_as_arrays(tmp_path):
    """The streaming refinery passes features on disk (spill.SpillArray): k-means (its own
    training sample, M > cap) and CLR give what they give on the in-memory array."""
    from mrtf.refinery.cluster import kmeans_assign, prototype_targets
    from mrtf.refinery.spill import Scratch

    rng = np.random.default_rng(0)
    feats = np.abs(rng.normal(size=(3000, 16))).astype(np.float32)
    targets = rng.dirichlet(np.ones(4), 3000).astype(np.float32)
    with Scratch(tmp_path) as sc:
        spill = sc.array("f", feats.shape)
        spill.write(0, feats)
        a, n = kmeans_assign(feats, 8, seed=1, max_points_per_centroid=50, block=700)
        b, _ = kmeans_assign(spill, 8, seed=1, max_points_per_centroid=50, block=700)
        np.testing.assert_array_equal(a, b)
        assert n == 8 and len(np.unique(a)) > 1
        for variant in ("paper", "reference"):
            np.testing.assert_array_equal(
                prototype_targets(targets, spill, variant=variant, chunk=512),
                prototype_targets(targets, feats, variant=variant, chunk=512))
