"""NRC (mrtf/refinery/nrc.py): reciprocal affinity, the expanded neighbourhood, the diversity
term and the whole loss against hand computation, and the adapter on a shifted toy problem."""

import copy

import numpy as np
import pytest
import torch
from sfda_toy import accuracy, shifted_digits

from mrtf.errors import InputError
from mrtf.refinery.neighbourhood import Banks
from mrtf.refinery.nrc import (
    NrcSettings,
    diversity,
    expanded_neighbours,
    nrc_adapt,
    nrc_loss,
    nrc_objective,
    reciprocal_affinity,
)


def _probs(*shape, seed=0):
    return torch.softmax(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), -1)


def test_reciprocal_affinity_is_one_for_mutual_neighbours_else_r():
    rows = torch.tensor([0, 7])
    nn_of_nn = torch.tensor([[[3, 0], [4, 5]],     # neighbour 1 of row 0 has 0 among its own
                             [[7, 1], [2, 3]]])    # neighbour 1 of row 7 has 7
    got = reciprocal_affinity(rows, nn_of_nn, 0.1)
    np.testing.assert_allclose(got, [[1.0, 0.1], [1.0, 0.1]])


def test_diversity_is_the_mean_predictions_negative_entropy():
    p = _probs(5, 4)
    mean = p.mean(0).numpy()
    assert float(diversity(p, 1e-5)) == pytest.approx(float((mean * np.log(mean + 1e-5)).sum()),
                                                      abs=1e-6)
    uniform = torch.full((3, 4), 0.25)
    assert float(diversity(uniform, 0.0)) == pytest.approx(-np.log(4))  # its minimum


def test_diversity_with_class_shares_is_kl_to_them_and_smallest_there():
    """NRC's L_div with the target's shares π: Σ p̄ log(p̄ / π), KL(p̄ ‖ π), 0 with no
    gradient at p̄ = π (up to ε) where the even spread's term is not; without π it is the
    term as before, bit for bit."""
    prior = (0.5, 0.3, 0.2)
    p = _probs(5, 3)
    mean = p.mean(0).numpy()
    want = float((mean * np.log((mean + 1e-5) / np.array(prior))).sum())
    assert float(diversity(p, 1e-5, prior)) == pytest.approx(want, abs=1e-6)
    at_prior = torch.tensor([prior, prior], dtype=torch.float64, requires_grad=True)
    kl = diversity(at_prior, 0.0, prior)
    kl.backward()
    assert float(kl.detach()) == pytest.approx(0.0, abs=1e-12)
    # the gradient along the simplex (its mean removed: Σ p̄ = 1) is 0 at p̄ = π
    g = at_prior.grad.sum(0)
    np.testing.assert_allclose(g - g.mean(), 0.0, atol=1e-12)
    assert float(diversity(at_prior.detach(), 0.0)) < -0.9  # the even spread's is not 0
    mean_t = p.mean(0)
    assert torch.equal(diversity(p, 1e-5, None), (mean_t * torch.log(mean_t + 1e-5)).sum())


def test_nrc_loss_reads_the_class_shares():
    p, near, expd = _probs(2, 3), _probs(2, 2, 3, seed=1), _probs(2, 4, 3, seed=2)
    aff = torch.full((2, 2), 0.1)
    prior = (0.6, 0.3, 0.1)
    even, told = NrcSettings(), NrcSettings(class_prior=prior)
    mean = p.mean(0)
    shift = -float((mean * torch.log(torch.tensor(prior))).sum())  # Σ p̄ log(1 / π)
    assert float(nrc_loss(p, near, aff, expd, told)) == pytest.approx(
        float(nrc_loss(p, near, aff, expd, even)) + shift, abs=1e-6)


@pytest.mark.parametrize("prior", [(1.0,), (0.5, 0.6), (1.0, 0.0), (float("nan"), 1.0)])
def test_bad_class_shares_are_refused(prior):
    with pytest.raises(InputError, match="NRC: class_prior must be"):
        NrcSettings(class_prior=prior).validate()


def test_class_shares_must_match_the_models_classes():
    with pytest.raises(InputError, match="NRC: 3 class shares for a model with 2 classes"):
        nrc_adapt(torch.nn.Linear(2, 2), None, NrcSettings(class_prior=(0.2, 0.3, 0.5)))


def test_nrc_loss_by_hand():
    s = NrcSettings(r=0.1, eps=1e-5)
    p, near, expd = _probs(2, 3), _probs(2, 2, 3, seed=1), _probs(2, 4, 3, seed=2)
    aff = torch.tensor([[1.0, 0.1], [0.1, 0.1]])
    mean = p.mean(0)
    want = float((mean * torch.log(mean + 1e-5)).sum())
    want -= np.mean([sum(float(aff[i, k]) * float(p[i] @ near[i, k]) for k in range(2))
                     for i in range(2)])
    want -= np.mean([sum(0.1 * float(p[i] @ expd[i, m]) for m in range(4)) for i in range(2)])
    assert float(nrc_loss(p, near, aff, expd, s)) == pytest.approx(want, abs=1e-6)


def _line_banks():
    angles = torch.tensor([0.0, 0.1, 0.25, 1.4, 1.5, 1.55])
    return Banks(torch.stack([angles.cos(), angles.sin()], 1), _probs(6, 3, seed=4))


def test_expanded_neighbours_leave_each_neighbour_out_but_may_hold_the_sample():
    banks = _line_banks()
    near = torch.tensor([[1, 2], [4, 5]])  # rows 0 and 3's 2 nearest
    got = expanded_neighbours(banks, near, 2)
    assert got.tolist() == [[[0, 2], [1, 0]], [[5, 3], [4, 3]]]


def test_the_objective_composes_the_pieces():
    banks = _line_banks()
    rows = torch.tensor([0, 3])
    p = _probs(2, 3, seed=5)
    s = NrcSettings(k=2, kk=2, mutual=0.5)
    near = torch.tensor([[1, 2], [4, 5]])
    nn_of_nn = torch.tensor([[[0, 2], [1, 0]], [[5, 3], [4, 3]]])
    aff = reciprocal_affinity(rows, nn_of_nn, s.r, s.mutual)
    np.testing.assert_allclose(aff, [[0.5, 0.5], [0.5, 0.5]])  # all four are reciprocal
    want = nrc_loss(p, banks.scores[near], aff, banks.scores[nn_of_nn].flatten(1, 2), s)
    assert float(nrc_objective(s)(p, rows, banks, 0.0)) == pytest.approx(float(want), abs=1e-6)


def test_bad_settings_are_one_clear_line():
    with pytest.raises(InputError, match="NRC: k and kk"):
        nrc_adapt(torch.nn.Linear(2, 2), None, NrcSettings(kk=0))
    with pytest.raises(InputError, match="NRC: r and mutual must"):
        nrc_adapt(torch.nn.Linear(2, 2), None, NrcSettings(r=-1.0))


def test_nrc_adapts_a_shifted_toy_problem():
    torch.set_num_threads(1)  # tiny steps (sfda_toy.py)
    model, target, y = shifted_digits()
    before = accuracy(model, target, y)
    assert 0.7 < before < 0.8
    adapted = nrc_adapt(copy.deepcopy(model), target, NrcSettings(), seed=0)
    assert accuracy(adapted, target, y) > before + 0.1


def test_the_default_is_the_code_as_run_every_neighbour_r():
    assert NrcSettings().mutual == NrcSettings().r == 0.1
    # the authors' code fills the expanded weights through an expanded view of the reciprocal
    # weights; PyTorch writes through, so those become r as well (nrc.py's module note)
    weight = torch.tensor([[1.0, 0.1], [1.0, 1.0]])
    weight.unsqueeze(-1).expand(-1, -1, 3).fill_(0.1)
    np.testing.assert_allclose(weight, 0.1)
    rows, nn_of_nn = torch.tensor([0]), torch.tensor([[[0, 4], [5, 6]]])
    np.testing.assert_allclose(reciprocal_affinity(rows, nn_of_nn, 0.1, mutual=0.1), [[0.1, 0.1]])
    np.testing.assert_allclose(reciprocal_affinity(rows, nn_of_nn, 0.1), [[1.0, 0.1]])
