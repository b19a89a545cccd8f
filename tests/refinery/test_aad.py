"""AaD (mrtf/refinery/aad.py): its loss pieces against hand computation, its settings' checks,
and the adapter on a deliberately shifted toy problem."""

import copy

import numpy as np
import pytest
import torch
from sfda_toy import accuracy, shifted_digits

from mrtf.errors import InputError
from mrtf.refinery.aad import (
    AadSettings,
    aad_adapt,
    aad_loss,
    aad_objective,
    dispersion,
    dispersion_weight,
)
from mrtf.refinery.neighbourhood import Banks


def _probs(*shape, seed=0):
    return torch.softmax(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), -1)


def test_dispersion_is_the_mean_dot_product_with_the_rest_of_the_batch():
    p = _probs(4, 3)
    want = np.mean([sum(float(p[i] @ p[m]) for m in range(4) if m != i) for i in range(4)])
    assert float(dispersion(p)) == pytest.approx(want, abs=1e-6)
    one_hot = torch.eye(3)
    assert float(dispersion(one_hot)) == 0.0  # distinct one-hot predictions: fully dispersed


def test_dispersion_weight_decays_from_alpha():
    assert dispersion_weight(0.0, 2.0, 5.0) == 2.0
    assert dispersion_weight(0.5, 1.0, 5.0) == pytest.approx(6.0 ** -5)
    assert dispersion_weight(0.9, 1.0, 0.0) == 1.0  # β = 0: no decay


def test_aad_loss_by_hand():
    p, s = _probs(3, 4), _probs(3, 2, 4, seed=1)
    attract = -np.mean([float(p[i] @ (s[i, 0] + s[i, 1])) for i in range(3)])
    disperse = np.mean([sum(float(p[i] @ p[m]) for m in range(3) if m != i) for i in range(3)])
    assert float(aad_loss(p, s, 0.25)) == pytest.approx(attract + 0.25 * disperse, abs=1e-6)


def test_the_objective_reads_the_nearest_rows_of_the_score_bank():
    # features on a line: row i's 2 nearest (itself left out) are known by hand
    angles = torch.tensor([0.0, 0.1, 0.25, 1.4, 1.5])
    feats = torch.stack([angles.cos(), angles.sin()], 1)
    scores = _probs(5, 3, seed=2)
    banks = Banks(feats, scores)
    p = _probs(2, 3, seed=3)
    rows = torch.tensor([0, 3])
    got = aad_objective(AadSettings(k=2, alpha=1.0, beta=5.0))(p, rows, banks, 0.1)
    near = torch.tensor([[1, 2], [4, 2]])
    assert float(got) == pytest.approx(float(aad_loss(p, scores[near], 2.0 ** -5)), abs=1e-6)


@pytest.mark.parametrize("bad,match", [(dict(k=0), "k must be"), (dict(lr=0.0), "lr must"),
                                       (dict(beta=float("nan")), "alpha and beta"),
                                       (dict(batch_size=1), "batch_size")])
def test_bad_settings_are_one_clear_line(bad, match):
    with pytest.raises(InputError, match=f"AaD: {match}"):
        aad_adapt(torch.nn.Linear(2, 2), None, AadSettings(**bad))


def test_aad_adapts_a_shifted_toy_problem():
    torch.set_num_threads(1)  # tiny steps (sfda_toy.py)
    model, target, y = shifted_digits()
    before = accuracy(model, target, y)
    assert 0.7 < before < 0.8
    adapted = aad_adapt(copy.deepcopy(model), target, AadSettings(), seed=0)
    assert accuracy(adapted, target, y) > before + 0.1
