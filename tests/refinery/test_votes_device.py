"""votes.SourceStats read on a torch device (device "cpu", and CUDA where present) against
the numpy it stands in for."""

import numpy as np
import pytest
import torch

from mrtf.refinery.config import RefineConfig
from mrtf.refinery.ensemble import stabilized_blocks
from mrtf.refinery.votes import SourceStats

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def logits():
    rng = np.random.default_rng(3)
    z = (rng.normal(0, 3, (9000, 10))[None] + rng.normal(0, 2, (4, 9000, 10))).astype(np.float32)
    z[:, :50, 3] = z[:, :50, 7] = z[:, :50].max(2) + 1  # ties: the first index wins
    return z


@pytest.mark.parametrize("device", DEVICES)
def test_source_stats_on_a_device_equal_numpy(logits, device):
    """votes.SourceStats read on the device: min, max and label counts exact, sums close."""
    config = RefineConfig(variant="paper")
    want, got = SourceStats(4, 10), SourceStats(4, 10, device=torch.device("cpu"))
    got.device = torch.device(device)  # the torch path, also on the CPU's torch
    for _, q in stabilized_blocks(logits, config):
        want.add(q)
        got.add(q)
    assert got.m == want.m == logits.shape[1]
    assert np.array_equal(got.lo, want.lo) and np.array_equal(got.hi, want.hi)
    assert np.array_equal(got.counts, want.counts)
    np.testing.assert_allclose(got.total, want.total, rtol=1e-12)
    assert SourceStats(4, 10, device="cpu").device is None  # numpy on the CPU


@pytest.mark.parametrize("device", DEVICES)
def test_debias_in_place_on_a_device_equals_numpy(logits, device, monkeypatch):
    """The uniform prior's rewrite of the spill, on the device the statistics were read on."""
    import mrtf.refinery.votes as votes_mod

    monkeypatch.setattr(votes_mod, "BLOCK", 4000)
    config = RefineConfig(variant="paper")
    q = np.concatenate([b for _, b in stabilized_blocks(logits, config)], 1)
    stats = SourceStats(4, 10)
    stats.add(q)
    want = np.ascontiguousarray(q.transpose(1, 0, 2))  # the (M, S, C) spill
    got = want.copy()

    class Spill(np.ndarray):
        def write(self, s, block):
            self[s:s + len(block)] = block

    votes_mod._debias_in_place(want.view(Spill), stats, [0, 2, 3], 0.7)
    stats.device = torch.device(device)
    votes_mod._debias_in_place(got.view(Spill), stats, [0, 2, 3], 0.7)
    np.testing.assert_allclose(got, want, rtol=0, atol=1.2e-7)
    assert np.array_equal(got[:, 1], q[1])  # a dead source is left as it was
    assert not np.allclose(got[:, 0], q[0])  # and the live ones did move
