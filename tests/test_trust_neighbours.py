"""mrtf.trust.neighbours: the target's own neighbourhoods, and the calibrator that reads them."""

import numpy as np
import pytest

from mrtf.io.hdf5 import ArraySource
from mrtf.trust.calibration import Signals, calibrate, features
from mrtf.trust.neighbours import label_consistency, reference_rows, target_neighbours


def _blobs(m=120, c=3, seed=0):
    """c tight, far-apart clusters in 1×6×6 'images'; row i belongs to cluster i % c."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 10, (c, 36))
    cl = np.arange(m) % c
    x = centres[cl] + rng.normal(0, 0.1, (m, 36))
    return ArraySource(x.reshape(m, 1, 6, 6).astype(np.float32)), cl


def test_neighbours_stay_in_their_cluster_and_exclude_themselves():
    src, cl = _blobs()
    nb = target_neighbours(src, k=5)
    assert nb.shape == (120, 5)
    assert not (nb == np.arange(120)[:, None]).any()
    assert (cl[nb] == cl[:, None]).all()
    assert label_consistency(cl, nb) == pytest.approx(np.ones(120))
    # labels that cut across the clusters agree with few of their neighbours
    wrong = np.random.default_rng(1).integers(0, 3, 120)
    assert label_consistency(wrong, nb).mean() < 0.6


def test_reference_subsample_and_blocks():
    src, cl = _blobs(m=250)
    ref = reference_rows(250, 40)
    assert len(ref) == 40 and ref[0] == 0 and ref[-1] == 249
    nb = target_neighbours(src, k=4, reference=40, block=33)
    assert np.isin(nb, ref).all()
    assert (cl[nb] == cl[:, None]).all()
    np.testing.assert_array_equal(nb, target_neighbours(src, k=4, reference=40, block=1000))
    assert target_neighbours(ArraySource(np.zeros((1, 4), np.float32))) is None


def _signals_for(labels, c=3, k=4, seed=0):
    """Parties that agree with ``labels`` at 70 %; probs peaked on the labels."""
    rng = np.random.default_rng(seed)
    m = len(labels)
    logits = rng.normal(0, 1, (k, m, c)).astype(np.float32)
    logits[:, np.arange(m), labels] += 2.0
    probs = np.full((m, c), 0.1, np.float32)
    probs[np.arange(m), labels] = 0.8
    return Signals.from_logits(logits, probs, probs), probs


def test_calibrator_trusts_labels_that_follow_the_clusters_more():
    src, cl = _blobs()
    s, probs = _signals_for(cl)
    fallback = calibrate(probs, s)
    assert "fallback" in fallback.method and fallback.notes
    s.neighbours = target_neighbours(src, k=5)
    follows = calibrate(probs, s)
    assert "fallback" not in follows.method and not follows.notes
    assert features(probs, s).shape == (120, 6)
    # the same labels, probabilities and parties; only the neighbourhoods now disagree
    s.neighbours = (s.neighbours + 1) % 120  # row j+1 is in the cluster after j's
    crosses = calibrate(probs, s)
    # the neighbour share's weight (COEF[2], 0.47 since the refit) moves a 0.97 estimate by
    # ~0.47·p(1−p) ≈ 0.015 when the share drops from ~1 to ~0
    assert crosses.estimated_accuracy < follows.estimated_accuracy - 0.01
    assert ((crosses.confidence > 0) & (crosses.confidence < 1)).all()
