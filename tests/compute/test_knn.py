"""mrtf.compute.knn (torch, device "cpu", and CUDA where present) against faiss-cpu's exact
flat indexes."""

import faiss
import numpy as np
import pytest
import torch

from mrtf.compute import knn as knn_mod
from mrtf.compute.knn import knn, nearest_block, topk_block

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _data(n, dim, seed):
    """Continuous random rows: no two similarities tie, so the neighbours are unique."""
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_knn_equals_faiss_flat(metric, device):
    db, q = _data(900, 24, 0), _data(300, 24, 1)
    index = faiss.IndexFlatIP(24) if metric == "ip" else faiss.IndexFlatL2(24)
    index.add(db)
    want_s, want_i = index.search(q, 7)
    scores, idx = knn(q, db, 7, device, metric, block=64, db_block=128)
    np.testing.assert_array_equal(idx, want_i)
    if metric == "ip":  # l2 ranks by 2 q·d - |d|², not the distance faiss reports
        np.testing.assert_allclose(scores, want_s, rtol=1e-5, atol=1e-5)


def test_blocks_bound_the_similarity_matrix(monkeypatch):
    """At most block × db_block similarities exist at once, and blocking changes nothing."""
    db, q = _data(500, 8, 2), _data(130, 8, 3)
    shapes = []
    real = knn_mod.similarities

    def spy(a, b, metric="ip"):
        shapes.append((len(a), len(b)))
        return real(a, b, metric)

    monkeypatch.setattr(knn_mod, "similarities", spy)
    small = knn(q, db, 5, "cpu", block=32, db_block=60)
    assert max(r * c for r, c in shapes) <= 32 * 60 and len(shapes) == 5 * 9
    np.testing.assert_array_equal(small[1], knn(q, db, 5, "cpu", block=1000, db_block=1000)[1])


def test_excluded_positions_are_skipped_in_every_block():
    db = _data(200, 6, 4)
    db /= np.linalg.norm(db, axis=1, keepdims=True)  # unit rows: each is its own nearest
    q = torch.from_numpy(db[:50])
    own = torch.arange(50)
    _, idx = topk_block(q, torch.from_numpy(db), 3, exclude=own, db_block=17)
    assert not (idx == own[:, None]).any()
    _, with_self = topk_block(q, torch.from_numpy(db), 1)
    np.testing.assert_array_equal(with_self[:, 0].numpy(), np.arange(50))  # itself, unmasked


def test_nearest_block_is_the_first_neighbour():
    db, q = torch.from_numpy(_data(300, 5, 5)), torch.from_numpy(_data(40, 5, 6))
    best = nearest_block(q, db)
    np.testing.assert_array_equal(best.numpy(), nearest_block(q, db, db_block=7).numpy())
    np.testing.assert_array_equal(best.numpy(), (q @ db.T).argmax(1).numpy())
    with pytest.raises(ValueError, match="metric"):
        knn_mod.similarities(q, db, "cosine")


def test_exclusion_by_mask_equals_exclusion_by_index():
    """The CUDA path's exclusion (a comparison with the column numbers, no indexing kernels)
    puts -inf exactly where the CPU's indexed write does, positions outside the block and -1
    included."""
    sim = torch.from_numpy(_data(40, 16, 4).astype(np.float64))
    pos = torch.from_numpy(np.random.default_rng(5).integers(-20, 36, 40))
    by_index = sim.clone()
    knn_mod._exclude_by_index(by_index, pos)
    by_mask = knn_mod._excluded_by_mask(sim, pos)
    assert torch.equal(by_mask, by_index)
    assert int(torch.isinf(by_mask).sum()) == int(((pos >= 0) & (pos < 16)).sum()) > 0

