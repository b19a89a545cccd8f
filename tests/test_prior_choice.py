"""The class-prior choice (prior_choice.py) and the adaptive consensus under ``auto``."""

import numpy as np
import pytest

from mrtf.io import ArraySource
from mrtf.refinery.adaptive import ConsensusInputs, adaptive_targets, consensus_targets
from mrtf.refinery.prior_choice import (
    PriorChoice,
    chance_agreement,
    choose_prior,
    neighbour_agreement,
)
from mrtf.refinery.teachers import stabilized_probs
from mrtf.refinery.votes import MemoryProbs, SourceStats
from mrtf.trust.neighbours import target_neighbours

C = 10


def _blobs(counts, rng):
    """Inputs (n, 32) with one tight cluster per class, and their classes (synthetic)."""
    centres = rng.normal(0, 1.0, (C, 32))
    y = np.repeat(np.arange(C), counts)
    return (centres[y] + rng.normal(0, 0.15, (len(y), 32))).astype(np.float32), y


def _biased_views(y, rng, bias=3.5, margin=2.5, sources=4):
    """Sources that all name class 0 too often (a shared class bias: a domain shift)."""
    views = []
    for _ in range(sources):
        z = rng.normal(0, 1.0, (len(y), C))
        z[np.arange(len(y)), y] += margin
        z[:, 0] += bias
        views.append(stabilized_probs(z, 4.0))
    return np.stack(views)


def test_choose_prior_keeps_the_labels_that_follow_the_neighbourhoods():
    neighbours = np.array([[1, 2], [0, 2], [0, 1], [4, 5], [3, 5], [3, 4]])
    clustered = np.array([0, 0, 0, 1, 1, 1])
    scattered = np.array([0, 1, 0, 1, 0, 1])
    assert neighbour_agreement(clustered, neighbours) == 1.0
    assert neighbour_agreement(scattered, neighbours) == pytest.approx(1 / 3)
    pick = choose_prior(scattered, clustered, neighbours)
    assert pick.chosen == "uniform" and pick.agreement["uniform"] == 1.0
    assert choose_prior(clustered, scattered, neighbours).chosen == "learned"
    tie = choose_prior(clustered, clustered, neighbours)  # a tie keeps the learned prior
    assert tie.chosen == "learned"
    assert "class prior: learned" in tie.line() and "uniform 1.000" in tie.line()



def test_labels_piled_onto_one_class_do_not_win_by_chance():
    """Three clusters of four. Labels that follow them with one slip each agree with fewer
    neighbours (0.5) than labels that name one class everywhere (1.0), but the one-class
    labels agree only as often as chance would (Σh² = 1): the excess over chance keeps the
    clustered ones."""
    neighbours = np.array([[j for j in range(4 * (i // 4), 4 * (i // 4) + 4) if j != i]
                           for i in range(12)])
    clustered = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 0])
    piled = np.zeros(12, int)
    assert neighbour_agreement(piled, neighbours) > neighbour_agreement(clustered, neighbours)
    assert chance_agreement(piled) == 1.0
    assert chance_agreement(clustered) == pytest.approx(3 * (4 / 12) ** 2)
    pick = choose_prior(piled, clustered, neighbours)
    assert pick.chosen == "uniform" and pick.excess["learned"] == 0.0
    assert choose_prior(clustered, piled, neighbours).chosen == "learned"
    assert "1.000 by chance" in pick.line()

@pytest.mark.parametrize("skewed", [False, True])
def test_auto_divides_a_models_bias_out_only_where_the_data_says_so(skewed):
    """Balanced target, biased models: uniform's labels follow the data's clusters, auto keeps
    them. A target that really holds mostly class 0: learned's do, auto keeps those."""
    rng = np.random.default_rng(11)
    counts = [700] + [30] * 9 if skewed else [100] * C
    x, y = _blobs(counts, rng)
    # skewed: unbiased but unsure models; dividing out their (right) lean to class 0 hurts
    probs = _biased_views(y, rng, bias=0.0, margin=1.0) if skewed else _biased_views(y, rng)
    neighbours = target_neighbours(ArraySource(x))
    names = list("abcd")
    auto = adaptive_targets(probs, names, probs[0], None, neighbours=neighbours)
    learned = adaptive_targets(probs, names, probs[0], None, class_prior="learned")
    uniform = adaptive_targets(probs, names, probs[0], None, class_prior="uniform")
    acc = {k: float((v.targets.argmax(1) == y).mean())
           for k, v in (("learned", learned), ("uniform", uniform))}
    best = max(acc, key=acc.get)
    assert abs(acc["learned"] - acc["uniform"]) > 0.05  # the case has a right answer
    assert isinstance(auto.prior, PriorChoice) and auto.prior.chosen == best
    assert best == ("learned" if skewed else "uniform")
    np.testing.assert_array_equal(auto.targets, (uniform if best == "uniform" else learned).targets)
    assert (auto.debias_strength > 0) == (best == "uniform")


def test_auto_without_neighbourhoods_is_the_learned_prior():
    rng = np.random.default_rng(12)
    x, y = _blobs([50] * C, rng)
    probs = _biased_views(y, rng)
    auto = adaptive_targets(probs, list("abcd"), probs[0], None)  # no neighbours given
    learned = adaptive_targets(probs, list("abcd"), probs[0], None, class_prior="learned")
    assert auto.prior is None and auto.debias_strength == 0.0
    np.testing.assert_array_equal(auto.targets, learned.targets)


def _given(probs, names, shares, neighbours=None):
    """The consensus with the class shares a user gave (refine: RefineConfig.class_shares)."""
    stats = SourceStats(probs.shape[0], probs.shape[2])
    stats.add(probs)
    return consensus_targets(MemoryProbs(probs), stats, ConsensusInputs(
        names, probs[0], neighbours=neighbours, class_shares=shares))


def test_given_class_shares_aim_the_bias_correction():
    """Frequencies the user gives: each model's bias is divided out toward them instead of
    toward an even spread ("given" in place of "uniform"). On a skewed target whose models
    lean to class 0 as the target does, the even correction moves labels off class 0 and
    the given one keeps them; "auto" still chooses between it and the learned prior by the
    target's neighbourhoods, and without them forms the given one alone."""
    rng = np.random.default_rng(11)
    counts = [700] + [30] * 9
    x, y = _blobs(counts, rng)
    probs = _biased_views(y, rng, bias=0.0, margin=1.0)
    names = list("abcd")
    shares = np.asarray(counts, np.float64) / sum(counts)
    alone = _given(probs, names, shares)
    uniform = adaptive_targets(probs, names, probs[0], None, class_prior="uniform")
    learned = adaptive_targets(probs, names, probs[0], None, class_prior="learned")
    acc = {k: float((v.targets.argmax(1) == y).mean())
           for k, v in (("given", alone), ("uniform", uniform), ("learned", learned))}
    assert acc["given"] > max(acc["uniform"], acc["learned"]) + 0.05
    assert alone.prior is None and alone.debias_strength > 0  # no neighbourhoods: no choice
    np.testing.assert_allclose(alone.class_shares, shares)
    chosen = _given(probs, names, shares, target_neighbours(ArraySource(x)))
    assert chosen.prior.chosen == "given" and set(chosen.prior.agreement) == {"learned", "given"}
    assert chosen.prior.line().startswith("class prior: given (chosen:")
    np.testing.assert_array_equal(chosen.targets, alone.targets)
    even = _given(probs, names, np.full(C, 1 / C))
    np.testing.assert_allclose(even.targets, uniform.targets, atol=1e-6)  # π even: as uniform
