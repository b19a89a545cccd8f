"""Block-wise Dawid-Skene (votes.py, spilled storage) against consensus.dawid_skene."""

import numpy as np

from mrtf.refinery import votes as sa
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


def test_debias_spill_equals_in_memory_debias(tmp_path, monkeypatch):
    """class_prior='uniform' on the spill: the whole-M statistics gathered block by block,
    then every live source's class bias divided out in place, as adaptive.debias does."""
    from mrtf.refinery.adaptive import debias, debias_strength

    monkeypatch.setattr(sa, "BLOCK", 128)
    rng = np.random.default_rng(1)
    probs = _views(rng)
    probs[:, 2] = probs[:, 2] ** 0.3 * np.array([4, 1, 1, 1, 1], np.float32)  # a class bias
    probs[:, 2] /= probs[:, 2].sum(-1, keepdims=True)
    stats = sa.SourceStats(probs.shape[1], probs.shape[2])
    for s in range(0, len(probs), 100):  # blocks that do not divide M
        stats.add(probs[s:s + 100].transpose(1, 0, 2))
    live = [0, 2, 3]
    want_s = debias_strength([probs[:, i] for i in live])
    with Scratch(tmp_path) as sc:
        spill = sc.array("p", probs.shape)
        spill.write(0, probs)
        strength = sa.debias_spill(spill, stats, live)
        got = spill[0:len(probs)]
    assert strength == want_s > 0
    for i in live:
        np.testing.assert_allclose(got[:, i], debias(probs[:, i], want_s), atol=1e-7)
    np.testing.assert_array_equal(got[:, 1], probs[:, 1])  # not live: untouched
    np.testing.assert_array_equal(stats.lo, probs.min(0))
    np.testing.assert_array_equal(stats.hi, probs.max(0))


def test_debias_toward_given_shares_on_the_spill_equals_in_memory(tmp_path, monkeypatch):
    """The class frequencies a user gave: each live source's bias divided out toward them
    over the spill (SpilledProbs.model_votes), as debias(prior=π) does in memory, which
    multiplies by π^s what the even correction gives."""
    from mrtf.refinery.adaptive import debias

    monkeypatch.setattr(sa, "BLOCK", 128)
    rng = np.random.default_rng(2)
    probs = _views(rng)
    prior = np.array([0.4, 0.3, 0.1, 0.1, 0.1])
    stats = sa.SourceStats(probs.shape[1], probs.shape[2])
    stats.add(probs.transpose(1, 0, 2))
    live, s = [0, 1, 3], 0.8
    with Scratch(tmp_path) as sc:
        spill = sc.array("p", probs.shape)
        spill.write(0, probs)
        sa.SpilledProbs(spill).model_votes(live, s, stats, prior)
        got = spill[0:len(probs)]
    for i in live:
        want = debias(probs[:, i], s, prior=prior)
        np.testing.assert_allclose(got[:, i], want, atol=1e-6)
        even = debias(probs[:, i], s) * prior ** s
        np.testing.assert_allclose(want, even / even.sum(1, keepdims=True), atol=1e-6)
    np.testing.assert_array_equal(got[:, 2], probs[:, 2])  # not live: untouched
