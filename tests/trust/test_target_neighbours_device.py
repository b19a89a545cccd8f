"""mrtf.trust.neighbours.target_neighbours on the torch path (device "cpu", and CUDA where
present) against its numpy path, on real digits."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

import mrtf.trust.neighbours as tn
from mrtf.compute.backend import Backend
from mrtf.io.hdf5 import ArraySource


@pytest.fixture(scope="module")
def source():
    return ArraySource((load_digits().images[:, None] / 16.0).astype(np.float32))


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
@pytest.mark.parametrize("reference", [1000, 300])
def test_the_same_neighbour_sets_as_numpy(source, monkeypatch, reference, device):
    """Every row's set of k neighbours equal (their order within a row is free: the
    consistency signal is a share), except rows whose k-th and (k+1)-th similarities tie
    within 1e-9 (none on digits at these sizes)."""
    want = tn.target_neighbours(source, k=10, reference=reference, block=333, device="cpu")
    monkeypatch.setattr(tn, "choose_backend",
                        lambda _=None: Backend("torch", torch.device(device)))
    got = tn.target_neighbours(source, k=10, reference=reference, block=333)
    assert got.dtype == want.dtype == np.int32 and got.shape == want.shape
    differ = [i for i in range(len(got)) if set(got[i]) != set(want[i])]
    assert differ == []
    labels = np.random.default_rng(0).integers(0, 10, len(source))
    np.testing.assert_allclose(tn.label_consistency(labels, got),
                               tn.label_consistency(labels, want))


def test_a_row_is_not_its_own_neighbour_on_the_device(source, monkeypatch):
    monkeypatch.setattr(tn, "choose_backend",
                        lambda device=None: Backend("torch", torch.device("cpu")))
    got = tn.target_neighbours(source, k=5, reference=500, block=128)
    assert not (got == np.arange(len(got))[:, None]).any()
