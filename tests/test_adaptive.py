"""The adaptive refinery's choice of sources (adaptive.py), on hand-built cases."""

import numpy as np
import pytest

from mrtf.refinery.adaptive import (
    adaptive_targets,
    cluster_weight,
    debias,
    debias_strength,
    estimated_accuracy,
    input_independent,
    label_diversity,
)
from mrtf.refinery.teachers import stabilized_probs

C, M = 10, 3000


def _view(labels, strength, rng, noise=1.0):
    """A source's stabilized softmax (Eq. 6, as the pipeline feeds them): logits with
    ``strength`` on the given labels plus Gaussian noise."""
    z = rng.normal(0, noise, (len(labels), C))
    z[np.arange(len(labels)), labels] += strength
    return stabilized_probs(z, 4.0)


def _specialists(y, rng, out_strength):
    """5 parties, each trained on 2 classes: right and sure on its own classes; elsewhere it
    names one of them with logit margin ``out_strength``."""
    views = []
    for k in range(5):
        own = np.array([2 * k, 2 * k + 1])
        inside = np.isin(y, own)
        guess = np.where(inside, y, own[rng.integers(0, 2, len(y))])
        z = rng.normal(0, 0.3, (len(y), C))
        z[np.arange(len(y)), guess] += np.where(inside, 6.0, out_strength)
        views.append(stabilized_probs(z, 4.0))
    return views


def _averaged(y, acc, rng):
    """θ_t or θ_{t+1}: right with probability ``acc``; otherwise stuck on classes 0 and 1."""
    return _view(np.where(rng.random(len(y)) < acc, y, rng.integers(0, 2, len(y))), 4.0, rng)


def _acc(p, y):
    return float((p.argmax(1) == y).mean())


def test_trusts_the_average_when_the_ensemble_is_wrong():
    """Overconfident specialists: their AvgProb is mostly wrong, θ_t and θ_{t+1} are right."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, C, M)
    locals_ = _specialists(y, rng, out_strength=6.0)
    glob = [_averaged(y, 0.9, rng), _averaged(y, 0.9, rng)]
    assert _acc(np.mean(locals_, axis=0), y) < 0.3
    out = adaptive_targets(np.stack(locals_ + glob), [f"p{i}" for i in range(7)], glob[1],
                           None, num_local=5)
    assert _acc(out.targets, y) >= 0.9
    accs = [s.estimated_accuracy for s in out.sources]
    assert min(accs[5:]) > max(accs[:5])  # the averages are named the trusted sources


def test_trusts_the_ensemble_when_the_average_is_wrong():
    """Specialists unsure outside their classes (ensemble right); confident averages stuck on
    two classes (as a poor one-shot average is)."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, C, M)
    locals_ = _specialists(y, rng, out_strength=0.0)
    glob = [_averaged(y, 0.1, rng), _averaged(y, 0.1, rng)]
    ens = _acc(np.mean(locals_, axis=0), y)
    assert ens > 0.9 and _acc(glob[1], y) < 0.25
    out = adaptive_targets(np.stack(locals_ + glob), [f"p{i}" for i in range(7)], glob[1],
                           None, num_local=5)
    assert _acc(out.targets, y) >= ens - 0.01
    assert all(s.estimated_accuracy < 0.2 for s in out.sources[5:])


def test_input_independent_sources_are_left_out_and_never_collapse_the_targets():
    rng = np.random.default_rng(2)
    y = rng.integers(0, C, 500)
    dead = np.tile(stabilized_probs(np.eye(C)[[3]] * 5, 4.0), (500, 1))
    own = _averaged(y, 0.9, rng)
    out = adaptive_targets(np.stack([dead, dead, dead]), ["a", "b", "c"], own, None)
    np.testing.assert_allclose(out.targets, own.astype(np.float32))  # falls back to θ_{t+1}
    assert all("same output for every sample" in s.reason for s in out.sources)
    assert not input_independent(out.targets)
    mixed = adaptive_targets(np.stack([dead, own, own]), ["dead", "x", "y"], own, None)
    assert [s.name for s in mixed.sources if s.weight == 0] == ["dead"]
    assert _acc(mixed.targets, y) > 0.85


def test_cluster_weight_follows_the_models_confidence():
    assert cluster_weight(1.0) == 0.0
    assert cluster_weight(0.99) == pytest.approx(0.2)
    assert cluster_weight(0.5) == 3.0  # capped
    assert cluster_weight(0.9) > cluster_weight(0.95)


def test_clusters_help_when_the_models_are_unsure():
    """Weak, unsure models + features that cluster by class: the cluster view lifts the labels."""
    rng = np.random.default_rng(3)
    y = rng.integers(0, C, 2000)
    centres = rng.normal(size=(C, 16)) * 4
    feats = (centres[y] + rng.normal(size=(2000, 16))).astype(np.float32)
    weak = [_view(np.where(rng.random(2000) < 0.35, y, rng.integers(0, C, 2000)), 1.0, rng)
            for _ in range(4)]
    probs = np.stack(weak)
    plain = adaptive_targets(probs, list("abcd"), weak[0], None)
    clustered = adaptive_targets(probs, list("abcd"), weak[0], feats, seed=0)
    assert clustered.cluster_weight > 0
    assert _acc(clustered.targets, y) > _acc(plain.targets, y) + 0.1


def test_estimated_accuracy_is_the_posterior_mass_of_the_chosen_labels():
    post = np.array([[0.9, 0.1], [0.2, 0.8]])
    assert estimated_accuracy(post, np.array([[1, 0], [1, 0]])) == pytest.approx(0.55)


def test_debias_divides_out_a_class_bias_and_spares_one_class_sources():
    rng = np.random.default_rng(4)
    y = rng.integers(0, C, 2000)
    z = rng.normal(0, 1.0, (2000, C))
    z[np.arange(2000), y] += 3.0
    z[:, 0] += 4.0  # a model moved to another domain: it names class 0 far too often
    biased = stabilized_probs(z, 4.0)
    assert np.bincount(biased.argmax(1), minlength=C)[0] > 0.5 * len(y)
    fixed = debias(biased, 1.0)
    np.testing.assert_allclose(fixed.sum(1), 1.0, rtol=1e-5)
    assert _acc(fixed, y) > _acc(biased, y) + 0.2
    assert debias(biased, 0.0) is biased
    one_class = np.tile(np.eye(C, dtype=np.float32)[[3]] * 0.9 + 0.01, (50, 1))
    assert label_diversity(one_class) == 0.0 and debias_strength([one_class]) == 0.0
    assert debias_strength([biased]) == 1.0


def test_uniform_class_prior_is_an_option_not_the_default():
    """Every source shares one class bias (a domain shift): the learned prior keeps it, the
    uniform prior (for targets known to be balanced) removes it."""
    rng = np.random.default_rng(5)
    y = rng.integers(0, C, 2000)
    views = []
    for _ in range(4):
        z = rng.normal(0, 1.0, (2000, C))
        z[np.arange(2000), y] += 2.5
        z[:, 0] += 3.5
        views.append(stabilized_probs(z, 4.0))
    probs = np.stack(views)
    learned = adaptive_targets(probs, list("abcd"), views[0], None)
    uniform = adaptive_targets(probs, list("abcd"), views[0], None, class_prior="uniform")
    assert learned.debias_strength == 0.0 and uniform.debias_strength == 1.0
    assert _acc(uniform.targets, y) > _acc(learned.targets, y) + 0.1
    with pytest.raises(ValueError, match="class_prior"):
        adaptive_targets(probs, list("abcd"), views[0], None, class_prior="balanced")
