"""mrtf.compute.softmax_rows: the logit-block arithmetic on a torch device (device "cpu",
and CUDA where present) against the numpy it stands in for (novelty.mean_entropies and
mean_agreement, ensemble.stabilized_blocks' paper variant, teachers.global_stds), read in
blocks from an array as from a spill; and the callers keep numpy on the CPU."""

import numpy as np
import pytest
import torch

from mrtf.compute import softmax_rows as sr
from mrtf.refinery import novelty
from mrtf.refinery.config import RefineConfig
from mrtf.refinery.ensemble import TARGET_CHUNK, stabilized_blocks
from mrtf.refinery.teachers import global_stds

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def logits():
    """(K=4, M, C=10) float32 logits of four teachers that mostly agree, with a few rows tied
    between two classes (the argmax must break ties as numpy does: first index), over more
    than one block of TARGET_CHUNK rows."""
    rng = np.random.default_rng(3)
    m = TARGET_CHUNK + 777
    truth = rng.normal(0, 3, (m, 10))
    z = (truth[None] + rng.normal(0, 2, (4, m, 10))).astype(np.float32)
    z[:, :50, 3] = z[:, :50, 7] = z[:, :50].max(2) + 1  # ties, on purpose
    return z


@pytest.mark.parametrize("device", DEVICES)
def test_entropies_and_agreement_equal_numpy(logits, device):
    dev = torch.device(device)
    m = logits.shape[1]
    for rows in (1000, m):
        got = sr.entropy_sums(logits, 3, rows, dev) / m
        np.testing.assert_allclose(got, novelty.mean_entropies(logits, 3), rtol=1e-12, atol=0)
        pairs = sr.agreeing_pairs(logits, 4, rows, dev) / (m * 4 * 3 / 2)
        assert pairs == novelty.mean_agreement(logits, 4)  # counts: exactly
    assert novelty.mean_entropies(logits, 3, device=dev) == pytest.approx(
        novelty.mean_entropies(logits, 3), rel=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_stabilized_softmax_and_stds_equal_numpy(logits, device):
    dev = torch.device(device)
    config = RefineConfig(variant="paper")
    want_std = global_stds(logits)
    np.testing.assert_allclose(sr.teacher_stds(logits, 1000, dev), want_std, rtol=1e-12)
    want = dict(stabilized_blocks(logits, config))
    got = dict(stabilized_blocks(logits, config, dev))
    assert list(got) == list(want) == [0, TARGET_CHUNK]
    for s in want:
        assert got[s].dtype == np.float32 and got[s].shape == want[s].shape
        # float64 softmax rounded to float32: at most one float32 step apart
        np.testing.assert_allclose(got[s], want[s], rtol=0, atol=1.2e-7)
        assert (got[s].argmax(2) == want[s].argmax(2)).all()


def test_callers_keep_numpy_on_the_cpu(logits, monkeypatch):
    """device None or "cpu": the numpy path, bit for bit (the torch functions never run)."""
    def refuse(*a, **k):
        raise AssertionError("the torch path ran on the CPU")
    for name in ("entropy_sums", "agreeing_pairs"):
        monkeypatch.setattr(novelty, name, refuse)
    import mrtf.refinery.ensemble as ensemble
    monkeypatch.setattr(ensemble, "stabilized_softmax", refuse)
    monkeypatch.setattr(ensemble, "teacher_stds", refuse)
    cpu = torch.device("cpu")
    assert novelty.mean_entropies(logits, 2, device=cpu).shape == (2,)
    assert 0 < novelty.mean_agreement(logits, 4, device="cpu") <= 1
    assert len(list(stabilized_blocks(logits, RefineConfig(variant="paper"), cpu))) == 2

