"""novelty.py: is the target new to the parties (vote or adapt)? Pure functions, no y."""

import numpy as np
import pytest

from mrtf.refinery.feature_shift import FEATURE_SHIFT, FeatureShift
from mrtf.refinery.novelty import (
    MIN_AGREEMENT,
    NOVELTY_GAP,
    mean_agreement,
    mean_entropies,
    target_novelty,
)


def _entropy(logits: np.ndarray) -> float:
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return float(-(p * np.log(p)).sum(1).mean())


class _Rows:
    """A (K, M, C) array read only as a[:k, s:e], like the streaming path's spill."""

    def __init__(self, a):
        self.a, self.shape, self.reads = a, a.shape, 0

    def __getitem__(self, key):
        teachers, rows = key
        assert isinstance(teachers, slice) and isinstance(rows, slice)
        self.reads += 1
        return self.a[teachers, rows]


def test_mean_entropies_per_model_and_blockwise():
    z = np.random.default_rng(0).normal(size=(3, 101, 7)) * [[[0.1]], [[2.0]], [[20.0]]]
    want = [_entropy(z[i]) for i in range(3)]
    np.testing.assert_allclose(mean_entropies(z, 3), want, rtol=1e-12)
    rows = _Rows(z)
    np.testing.assert_allclose(mean_entropies(rows, 2, block_bytes=8 * 2 * 7 * 10), want[:2],
                               rtol=1e-12)
    assert rows.reads == 11  # 101 rows in blocks of 10
    assert mean_entropies(np.zeros((1, 5, 4)), 1)[0] == pytest.approx(np.log(4))


def _models(scale: float, k: int = 5) -> np.ndarray:
    """k models' logits whose entropy falls as ``scale`` grows."""
    return np.random.default_rng(1).normal(size=(k, 200, 10)) * scale


def test_unsure_on_the_target_but_sure_of_their_data_adapts():
    z = _models(0.5)  # entropy ≈ 2 nats
    n = target_novelty(z, [0.05] * 5)
    assert n.adapt and n.gap == pytest.approx(n.target_entropy - 0.05) and n.gap > NOVELTY_GAP
    assert "adapted" in n.line()


def test_as_sure_on_the_target_as_on_their_data_votes():
    z = _models(8.0)
    h = float(np.median(mean_entropies(z, 5)))
    n = target_novelty(z, [h + 0.05] * 5)
    assert not n.adapt and n.gap == pytest.approx(-0.05)
    assert "vote is distilled" in n.line()


def test_one_party_lying_about_its_loss_cannot_flip_the_choice():
    z = _models(0.5)
    honest = float(np.median(mean_entropies(z, 5))) + 0.5
    assert not target_novelty(z, [honest] * 4 + [0.0]).adapt
    assert not target_novelty(z, [honest] * 4 + [1e6]).adapt


def test_no_signal_without_reported_losses():
    z = _models(0.5)
    for losses in ([None] * 5, [0.01, 0.01, None, None, None], [float("nan")] * 5):
        n = target_novelty(z, losses)
        assert n.gap is None and not n.adapt and "unknown" in n.line()
    assert target_novelty(z, [0.01, 0.01, 0.01, None, None]).adapt  # a majority reported


def test_only_the_first_num_local_models_count():
    z = np.concatenate([_models(8.0, 3), _models(0.1, 2)])  # two unsure self-teachers after
    assert target_novelty(z, [1.0] * 3, num_local=3).target_entropy < 0.5


SHIFTED = FeatureShift((0.5, 0.4, 0.6, 0.5, 0.5), 0.5)
STILL = FeatureShift((0.02,) * 5, 0.02)
NO_BN = FeatureShift((None,) * 5, None)


def _agreeing(agree: bool, k: int = 5) -> np.ndarray:
    """k models' logits on 300 rows: the same labels (agree) or independent ones, each model
    equally unsure (entropy ≈ 1.7 nats)."""
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 10, size=(1 if agree else k, 300)).repeat(k if agree else 1, 0)
    return np.eye(10)[labels] * 1.5 + rng.normal(size=(k, 300, 10)) * 0.1


def test_mean_agreement_pairs_and_blocks():
    z = _agreeing(False)
    labels = z.argmax(2)
    want = np.mean([(labels[i] == labels[j]).mean() for i in range(5) for j in range(i + 1, 5)])
    assert mean_agreement(z, 5) == pytest.approx(want)
    assert mean_agreement(_Rows(z), 5, block_bytes=8 * 5 * 10 * 7) == pytest.approx(want)
    assert mean_agreement(_agreeing(True), 5) == 1.0 and mean_agreement(z, 1) == 1.0


def test_feature_shift_adapts_where_the_claims_say_familiar_if_the_parties_agree():
    """Parties that claim a loss as high as their target entropy (label smoothing) but whose
    BatchNorm statistics say the target is new: adapted, by the feature shift."""
    z = _agreeing(True)
    h = float(np.median(mean_entropies(z, 5)))
    n = target_novelty(z, [h] * 5, shift=SHIFTED)
    assert n.gap < NOVELTY_GAP and n.adapt and n.by == "feature shift"
    assert n.feature_shift == 0.5 > FEATURE_SHIFT and n.agreement >= MIN_AGREEMENT
    assert "feature shift 0.500" in n.line() and "adapted" in n.line()
    assert target_novelty(z, [None] * 5, shift=SHIFTED).adapt  # no claims needed
    assert not target_novelty(z, [h] * 5, shift=STILL).adapt


def test_feature_shift_is_not_read_over_label_skewed_parties():
    z = _agreeing(False)  # they agree on ~0.1 of the target
    h = float(np.median(mean_entropies(z, 5)))
    n = target_novelty(z, [h] * 5, shift=SHIFTED)
    assert n.agreement < MIN_AGREEMENT and not n.adapt and n.by is None
    assert "not read" in n.line() and "vote is distilled" in n.line()


def test_without_a_reading_the_loss_gap_decides_as_before():
    for z in (_models(0.5), _models(8.0), _agreeing(True)):
        for losses in ([0.05] * 5, [5.0] * 5, [None] * 5):
            before = target_novelty(z, losses)
            for shift in (None, NO_BN):
                n = target_novelty(z, losses, shift=shift)
                assert (n.gap, n.adapt, n.line()) == (before.gap, before.adapt, before.line())
                assert n.feature_shift is None and n.agreement is None
    n = target_novelty(_models(0.5), [0.05] * 5, shift=STILL)  # the gap alone is enough
    assert n.adapt and n.by == "loss gap"


def test_to_dict_keeps_the_earlier_keys_first():
    d = target_novelty(_agreeing(True), [0.1] * 5, shift=SHIFTED).to_dict()
    assert list(d) == ["gap", "target_entropy", "train_loss", "adapt", "line",
                       "feature_shift", "agreement", "by"]
