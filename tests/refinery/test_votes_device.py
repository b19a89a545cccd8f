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
