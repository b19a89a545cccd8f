"""feature_shift.py: the target's features against the parties' BatchNorm running statistics
(tiny synthetic networks; no y anywhere)."""

import numpy as np
import pytest
import torch
from torch import nn

from mrtf.io.hdf5 import ArraySource
from mrtf.refinery.feature_shift import (
    FEATURE_SHIFT,
    batchnorms,
    feature_shift,
    layer_shifts,
    model_shift,
)
from mrtf.trust.neighbours import reference_rows


def _source(n: int = 4000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 6)).astype(np.float32)


def _bn_net(seed: int, dropout: float = 0.0, data: np.ndarray | None = None) -> nn.Module:
    """A tiny party: Linear → (Dropout) → BatchNorm1d → ReLU → Linear, its running statistics
    collected on ``data`` (default: N(0, 1) inputs) in training mode, as a party's are."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, 16), nn.Dropout(dropout), nn.BatchNorm1d(16), nn.ReLU(),
                        nn.Linear(16, 3))
    net[2].momentum = None  # the cumulative average: the statistics of all of ``data``
    net.train()
    with torch.no_grad():
        for s in range(0, 4000, 500):
            net(torch.from_numpy((_source(seed=seed) if data is None else data)[s:s + 500]))
    return net.eval()


def test_same_distribution_is_small_a_shifted_input_is_large():
    net = _bn_net(0)
    same = model_shift(net, _source(seed=7))
    shifted = model_shift(net, _source(seed=7) + 1.5)
    assert same < 0.02 < FEATURE_SHIFT < 1.0 < shifted
    rescaled = model_shift(net, _source(seed=7) * 3.0)  # the spread alone moves it too
    assert rescaled > 1.0


def test_statistics_are_read_not_updated_and_modes_and_generator_are_kept():
    net = _bn_net(0, dropout=0.5)
    net[1].train()  # a caller's mixed modes come back as they were
    running = net[2].running_mean.clone(), net[2].running_var.clone()
    state = torch.get_rng_state()
    layer_shifts(net, [_source(seed=3)[:256] + 2.0], dropout_on=True)
    assert torch.equal(net[2].running_mean, running[0])
    assert torch.equal(net[2].running_var, running[1])
    assert net[1].training and not net[0].training and not net[2].training
    assert torch.equal(torch.get_rng_state(), state)


def test_dropout_is_on_as_the_parties_trained():
    """Statistics collected under dropout carry its noise; read without it the same data
    looks shifted, read with it they match (the deterministic seed gives equal readings)."""
    net = _bn_net(0, dropout=0.5)
    x = _source(seed=5)
    eval_mode = np.mean([ls.symmetric_kl().mean() for ls in layer_shifts(net, [x])])
    assert model_shift(net, x) < 0.05 < eval_mode
    assert model_shift(net, x) == model_shift(net, x)


def test_median_over_parties_and_one_wild_party_cannot_flip_it():
    parties = [_bn_net(s) for s in range(4)]
    with torch.no_grad():
        parties[3][2].running_mean += 50.0  # one party's statistics say anything at all
    fs = feature_shift(parties, ArraySource(_source(seed=9)))
    assert len(fs.per_party) == 4 and fs.per_party[3] > 100
    assert fs.shift < 0.05 and not fs.shifted
    moved = feature_shift(parties, ArraySource(_source(seed=9) + 2.0))
    assert moved.shifted and moved.shift > FEATURE_SHIFT


def test_broken_statistics_read_as_infinitely_far_and_the_median_holds():
    parties = [_bn_net(s) for s in range(5)]
    with torch.no_grad():
        parties[1][2].running_var.fill_(float("nan"))  # untrusted weights: no distribution
        parties[2][2].running_var.fill_(-1.0)
    fs = feature_shift(parties, ArraySource(_source(seed=9)))
    assert fs.per_party[1] == float("inf") and 1e3 < fs.per_party[2] < float("inf")
    assert fs.shift < 0.05 and not fs.shifted


def test_a_plain_network_gives_no_reading():
    plain = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).eval()
    assert batchnorms(plain) == [] and model_shift(plain, _source()) is None

    class Untouchable(ArraySource):
        def take(self, indices):
            raise AssertionError("no BatchNorm anywhere: the target is not read")

    for models in ([plain, plain], [_bn_net(0), plain], []):
        fs = feature_shift(models, Untouchable(_source()))
        assert fs.shift is None and not fs.shifted
        assert fs.per_party == tuple(None for _ in models)


def test_rows_read_evenly_spaced_and_bounded():
    assert list(reference_rows(5, 10)) == [0, 1, 2, 3, 4]
    rows = reference_rows(10_000, 2048)
    assert len(rows) == 2048 and rows[0] == 0 and rows[-1] == 9999
    assert np.all(np.diff(rows) > 0)


@pytest.mark.parametrize("shape", [(64, 5), (64, 5, 7), (64, 5, 3, 3)])
def test_layer_statistics_match_numpy_for_1d_2d_inputs(shape):
    """Per-channel mean and variance over the batch and every spatial position."""
    bn = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d}[len(shape)](5).eval()
    x = np.random.default_rng(2).normal(2.0, 3.0, size=shape).astype(np.float32)
    (ls,) = layer_shifts(bn, [x[:40], x[40:]])
    flat = np.moveaxis(x, 1, 0).reshape(5, -1).astype(np.float64)
    np.testing.assert_allclose(ls.target_mean, flat.mean(1), rtol=1e-6)
    np.testing.assert_allclose(ls.target_var, flat.var(1), rtol=1e-5)
    np.testing.assert_allclose(ls.source_var, 1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_read_on_cuda_equals_the_cpu_and_the_party_stays_home():
    """The refine passes its device (CUDA by default): the party's model is lent to it for
    the pass (placement.py) and comes back to the CPU; the reading agrees to float64 sums."""
    net, x = _bn_net(0), _source(seed=7) + 0.5
    on_cpu = model_shift(net, x, "cpu")
    on_cuda = model_shift(net, x, "cuda")
    assert next(net.parameters()).device.type == "cpu"
    assert on_cuda == pytest.approx(on_cpu, rel=1e-5)
