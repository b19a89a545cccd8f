"""Dawid-Skene consensus (consensus.py) on hand-built annotators with known confusions."""

import numpy as np
import pytest

from mrtf.refinery.consensus import confusion, dawid_skene


def _annotator(y, acc, c, rng):
    """Hard votes: the truth with probability ``acc``, else a uniformly random other class."""
    wrong = (y + rng.integers(1, c, len(y))) % c
    pick = np.where(rng.random(len(y)) < acc, y, wrong)
    return np.eye(c)[pick]


def test_recovers_truth_and_each_annotators_accuracy():
    rng = np.random.default_rng(0)
    c, m = 5, 3000
    y = rng.integers(0, c, m)
    accs = [0.9, 0.7, 0.5, 0.3, 0.25]
    views = [_annotator(y, a, c, rng) for a in accs]
    init = np.mean(views, axis=0)
    out = dawid_skene(views, init)
    majority = (init.argmax(1) == y).mean()
    assert (out.posterior.argmax(1) == y).mean() > majority + 0.02
    for v, a in enumerate(accs):
        assert out.estimated_accuracy(v) == pytest.approx(a, abs=0.04)


def test_a_view_at_chance_changes_nothing():
    rng = np.random.default_rng(1)
    c, m = 4, 2000
    y = rng.integers(0, c, m)
    views = [_annotator(y, 0.8, c, rng) for _ in range(3)]
    noise = np.eye(c)[rng.integers(0, c, m)]
    init = np.mean(views, axis=0)
    a = dawid_skene(views, init).posterior.argmax(1)
    b = dawid_skene(views + [noise], init).posterior.argmax(1)
    assert (a == b).mean() > 0.97


def test_views_may_answer_in_another_alphabet():
    """A clustering with 2C clusters that refine the classes is learnt as informative."""
    rng = np.random.default_rng(2)
    c, m = 4, 2000
    y = rng.integers(0, c, m)
    clusters = np.eye(2 * c)[2 * y + rng.integers(0, 2, m)]
    weak = [_annotator(y, 0.45, c, rng) for _ in range(3)]
    init = np.mean(weak, axis=0)
    without = (dawid_skene(weak, init).posterior.argmax(1) == y).mean()
    with_ = (dawid_skene(weak + [clusters], init).posterior.argmax(1) == y).mean()
    assert with_ > without + 0.1


def test_zero_weight_ignores_a_view_and_weights_are_checked():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 3, 500)
    views = [_annotator(y, 0.7, 3, rng) for _ in range(3)]
    other = np.eye(3)[rng.integers(0, 3, 500)]
    init = np.mean(views, axis=0)
    a = dawid_skene(views, init).posterior
    b = dawid_skene(views + [other], init, weights=[1, 1, 1, 0]).posterior
    np.testing.assert_allclose(a, b, atol=1e-12)
    with pytest.raises(ValueError):
        dawid_skene(views, init, weights=[1.0])


def test_confusion_rows_are_distributions():
    post = np.array([[1.0, 0.0], [0.2, 0.8]])
    votes = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    pi = confusion(post, votes)
    assert pi.shape == (2, 3)
    np.testing.assert_allclose(pi.sum(1), 1.0)
