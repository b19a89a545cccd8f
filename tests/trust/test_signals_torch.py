"""trust.signals_torch: calibration.Signals' tallies in torch (device "cpu", and CUDA where
present) against the numpy loop, and Signals.from_logits on a device against the CPU's."""

import numpy as np
import pytest
import torch

from mrtf.trust import calibration
from mrtf.trust.calibration import Signals
from mrtf.trust.signals_torch import tallies_torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def logits():
    rng = np.random.default_rng(5)
    truth = rng.normal(0, 3, (3000, 10))
    z = (truth[None] + rng.normal(0, 2.5, (5, 3000, 10))).astype(np.float32)
    z[:, :40, 2] = z[:, :40, 8] = z[:, :40].max(2) + 1  # ties: the first index wins
    return z


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block", [700, 3000])
def test_tallies_equal_numpy(logits, device, block):
    want = calibration._tallies(logits, 4, block)
    got = tallies_torch(logits, 4, block, torch.device(device))
    assert np.array_equal(got[0], want[0])  # votes: the same float32 additions
    np.testing.assert_allclose(got[1], want[1], rtol=0, atol=1.2e-7)
    np.testing.assert_allclose(got[2], want[2], rtol=1e-12)
    assert np.array_equal(got[3], want[3])


@pytest.mark.parametrize("device", DEVICES)
def test_signals_from_logits_on_a_device(logits, device):
    avg = np.full((3000, 10), 0.1, np.float32)
    want = Signals.from_logits(logits, avg, avg, block=1000, models=4)
    got = Signals.from_logits(logits, avg, avg, block=1000, models=4,
                              device=torch.device(device))
    assert np.array_equal(got.votes, want.votes)
    np.testing.assert_allclose(got.mean_prob, want.mean_prob, atol=1.2e-7, rtol=0)
    assert got.local_confidence == pytest.approx(want.local_confidence, rel=1e-12)
    assert got.pairwise_agreement == want.pairwise_agreement
