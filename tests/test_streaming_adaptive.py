"""Block-wise Dawid-Skene (streaming_adaptive.py) against consensus.dawid_skene."""

import numpy as np

from mrtf.refinery import streaming_adaptive as sa
from mrtf.refinery.consensus import dawid_skene
from mrtf.refinery.spill import Scratch


def _views(rng, m=900, s=4, c=5):
    y = rng.integers(0, c, m)
    z = rng.normal(size=(m, s, c)) + 2.0 * np.eye(c)[y][:, None]
    p = np.exp(z)
    return (p / p.sum(-1, keepdims=True)).astype(np.float32)


def test_dawid_skene_blocks_equals_in_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(sa, "BLOCK", 128)
    rng = np.random.default_rng(0)
    probs = _views(rng)
    assign = rng.integers(0, 6, len(probs))
    hot = np.eye(6, dtype=np.float32)[assign]
    views = [probs[:, i] for i in range(probs.shape[1])] + [hot]
    init = np.mean(views[:3], axis=0)
    weights = [1.0, 1.0, 1.0, 0.75, 2.0]
    want = dawid_skene(views, init, weights)
    with Scratch(tmp_path) as sc:
        spill = sc.array("p", probs.shape)
        spill.write(0, probs)
        post = np.empty((len(probs), 5))
        bv = sa.BlockViews(spill, range(4), assign, 6)
        sa._init(bv, 3, len(probs), post)
        got = sa.dawid_skene_blocks(bv, post, weights)
    assert got.iterations == want.iterations
    np.testing.assert_allclose(got.posterior, want.posterior, atol=1e-10)
    np.testing.assert_array_equal(got.posterior.argmax(1), want.posterior.argmax(1))
    for a, b in zip(got.confusions, want.confusions):
        np.testing.assert_allclose(a, b, atol=1e-12)
    np.testing.assert_allclose(got.prior, want.prior, atol=1e-12)


def test_dead_sources_from_running_extremes():
    lo = np.zeros((3, 2), np.float32)
    hi = np.array([[1, 1], [0, 0], [1e-7, 0]], np.float32)
    assert sa.live_sources(lo, hi, 10) == [0]
    assert sa.live_sources(lo, hi, 1) == [0, 1, 2]  # one sample: nothing is "constant"
