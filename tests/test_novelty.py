"""novelty.py: is the target new to the parties (vote or adapt)? Pure functions, no y."""

import numpy as np
import pytest

from mrtf.refinery.novelty import NOVELTY_GAP, mean_entropies, target_novelty


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
