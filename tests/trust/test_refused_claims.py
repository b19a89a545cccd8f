"""A party flagged for its claims alone (train_loss 0, n_samples far above the others') is
named and its claim refused, but its votes are not halved: on the one-shot digits set (real
data, 6 LeNet parties) its averaging and ensemble weights are those of the clean set, capped
claim aside; a party that also misbehaves keeps the halving (mrtf.trust.reliability)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mrtf.io import H5Dataset, load_received
from mrtf.io.bundles import ReceivedModel, ReceivedSet
from mrtf.refinery.assess import assess_received
from mrtf.trust import assess
from mrtf.trust.reliability import CLAIM_CAP, DOWN_WEIGHT


@pytest.fixture(scope="module")
def oneshot(digits_oneshot):
    received, target = digits_oneshot
    return load_received(received), target


def _claiming(rs: ReceivedSet, **meta) -> ReceivedSet:
    """``rs`` with party 0's metadata changed by ``meta`` (its weights untouched)."""
    models = list(rs.models)
    m = models[0]
    models[0] = ReceivedModel(m.path, replace(m.meta, **meta), m.state_dict)
    return ReceivedSet(models, [])


def _report(rs: ReceivedSet, target):
    with H5Dataset(target) as src:
        return assess_received(rs, src, "cpu")


def test_loss_claim_is_refused_without_halving_the_votes(oneshot):
    rs, target = oneshot
    clean = _report(rs, target)
    report = _report(_claiming(rs, train_loss=0.0), target)
    p0 = report.parties[0]
    assert p0.verdict == "down-weighted" and p0.claims_only
    assert any("train_loss" in r for r in p0.refused_claims)
    assert report.factors() == [1.0] * len(report.parties)
    np.testing.assert_allclose(report.weights, clean.weights, rtol=1e-12)


def test_a_refused_sample_claim_counts_as_the_median_claim_and_is_not_halved(oneshot):
    rs, target = oneshot
    report = _report(_claiming(rs, n_samples=10**6, label_counts=None), target)
    p0 = report.parties[0]
    assert p0.verdict == "down-weighted" and p0.claims_only and p0.factor == 1.0
    assert any("refused" in r and "median claim's weight" in r for r in p0.refused_claims)
    claims = [10**6] + [m.meta.n_samples for m in rs.by_role("local")[1:]]
    median = float(np.median(claims))
    assert 10**6 > CLAIM_CAP * median
    base = [median] + [float(c) for c in claims[1:]]  # the honest claims stand
    assert report.weights[0] == pytest.approx(median / sum(base))
    np.testing.assert_allclose(report.weights[1:], np.array(base[1:]) / sum(base), rtol=1e-9)


def test_a_claim_does_not_shield_misbehaviour():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, 400)
    logits = np.stack([np.eye(10)[y] * 5 + rng.normal(0, 0.5, (400, 10)) for _ in range(6)])
    logits[0] = rng.normal(0, 1, (400, 10))  # agrees with nobody, and claims loss 0
    report = assess([f"p{i}" for i in range(6)], logits, None, None,
                    [0.0, 0.3, 0.4, 0.35, 0.3, 0.5])
    p0 = report.parties[0]
    assert p0.verdict == "down-weighted" and not p0.claims_only
    assert p0.factor == DOWN_WEIGHT
    assert report.weights[0] < min(report.weights[1:])
