"""What AaD and NRC share (mrtf/refinery/neighbourhood.py): nearest neighbours without the
sample itself, the attraction term against a hand computation and the authors' KL form, the
banks, and the training loop's determinism and edge cases."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mrtf.errors import InputError
from mrtf.io.hdf5 import ArraySource
from mrtf.refinery.aad import AadSettings, aad_objective
from mrtf.refinery.neighbourhood import (
    _Features,
    adapt_with_banks,
    attraction,
    classifier_head,
    fill_banks,
    nearest,
)


def _probs(*shape, seed=0):
    return torch.softmax(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), -1)


def test_nearest_is_by_cosine_and_leaves_the_sample_out():
    bank = F.normalize(torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.6, 0.8],
                                     [-1.0, 0.0]]), dim=1)
    got = nearest(bank[[0, 2]], bank, 2, torch.tensor([0, 2]))
    assert got.tolist() == [[1, 3], [3, 1]]
    # a row identical to the query is still a neighbour; only the named row is left out
    twin = torch.cat([bank, bank[:1]])
    assert nearest(twin[[0]], twin, 1, torch.tensor([0])).tolist() == [[5]]


def test_nearest_in_blocks_equals_one_block():
    bank = F.normalize(torch.randn(300, 7, generator=torch.Generator().manual_seed(1)), dim=1)
    rows = torch.arange(300)
    sim = bank @ bank.T
    sim[rows, rows] = -np.inf
    np.testing.assert_array_equal(nearest(bank, bank, 4, rows), sim.topk(4, 1).indices)


def test_attraction_by_hand_and_as_the_authors_kl_form():
    p, s = _probs(3, 4), _probs(3, 2, 4, seed=1)
    w = torch.tensor([[1.0, 0.1], [0.1, 0.1], [1.0, 1.0]])
    want = -np.mean([sum(float(w[i, k]) * float(p[i] @ s[i, k]) for k in range(2))
                     for i in range(3)])
    assert float(attraction(p, s, w)) == pytest.approx(want, abs=1e-6)
    assert float(attraction(p, s)) == pytest.approx(
        -np.mean([float(p[i] @ s[i].sum(0)) for i in range(3)]), abs=1e-6)
    # the codes' F.kl_div(p, s) (p unlogged) is Σ s log s − Σ s·p: the same gradient in p
    a = p.clone().requires_grad_(True)
    attraction(a, s, w).backward()
    b = p.clone().requires_grad_(True)
    kl = F.kl_div(b.unsqueeze(1).expand(-1, 2, -1), s, reduction="none").sum(-1)
    (kl * w).sum(1).mean().backward()
    np.testing.assert_allclose(a.grad, b.grad, atol=1e-6)


def _mlp(seed=0, dropout=0.0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Dropout(dropout), nn.Linear(8, 3))


def test_banks_hold_the_heads_input_normalised_and_the_softmax_in_eval_mode():
    model = _mlp(dropout=0.5)
    x = np.random.default_rng(0).normal(size=(50, 6)).astype(np.float32)
    feats = _Features(classifier_head(model, "test"))
    try:
        banks = fill_banks(model.train(), ArraySource(x), feats, torch.device("cpu"))
    finally:
        feats.remove()
    model.eval()
    with torch.no_grad():
        h = model[:3](torch.from_numpy(x))
        np.testing.assert_allclose(banks.features, F.normalize(h, dim=1), atol=1e-6)
        np.testing.assert_allclose(banks.scores, torch.softmax(model(torch.from_numpy(x)), 1),
                                   atol=1e-6)


def test_the_loop_is_deterministic_given_the_seed_and_keeps_the_device_and_mode():
    torch.set_num_threads(1)  # tiny steps (sfda_toy.py)
    x = np.random.default_rng(0).normal(size=(120, 6)).astype(np.float32)
    settings = AadSettings(epochs=2, batch_size=16)

    def run(seed):
        m = adapt_with_banks(_mlp(dropout=0.3), ArraySource(x), aad_objective(settings),
                             settings, seed, "cpu")
        assert not m.training
        return torch.cat([p.detach().flatten() for p in m.parameters()])

    a, b, c = run(0), run(0), run(1)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.equal(a, torch.cat([p.detach().flatten() for p in _mlp().parameters()]))


def test_nothing_to_do_leaves_the_model_and_a_model_without_linear_is_refused():
    model = _mlp()
    before = copy.deepcopy(model.state_dict())
    settings = AadSettings()
    one = ArraySource(np.zeros((1, 6), np.float32))
    out = adapt_with_banks(model, one, aad_objective(settings), settings)
    assert all(torch.equal(before[k], v) for k, v in out.state_dict().items())
    zero = AadSettings(epochs=0)
    adapt_with_banks(model, ArraySource(np.zeros((9, 6), np.float32)), aad_objective(zero), zero)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    conv = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten())
    with pytest.raises(InputError, match="AaD needs a model whose classifier is an nn.Linear"):
        adapt_with_banks(conv, ArraySource(np.zeros((4, 1, 5, 5), np.float32)),
                         aad_objective(settings), settings, name="AaD")
