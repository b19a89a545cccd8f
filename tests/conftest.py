"""Shared fixtures: small real data (scikit-learn digits) and a tiny simulated federation."""

from __future__ import annotations

import pytest
import torch

from mrtf.federated import RunConfig, export_received, export_target, run_fedavg

# One fixed thread count for the whole suite, whatever OMP_NUM_THREADS says: float results
# (and so exact-equality assertions) depend on it.
SUITE_THREADS = 2
torch.set_num_threads(SUITE_THREADS)


@pytest.fixture(scope="module", autouse=True)
def _module_threads():
    """Every module starts (and leaves) with the suite's thread count."""
    torch.set_num_threads(SUITE_THREADS)
    yield
    torch.set_num_threads(SUITE_THREADS)


@pytest.fixture(autouse=True)
def _restore_threads():
    """Tests may pick their own thread count; none leaks into the next test (order-free)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def digits_federation(tmp_path_factory):
    """Received models (4 LeNet clients + θ_t) and a target set from 2 rounds on digits."""
    root = tmp_path_factory.mktemp("fed")
    cfg = RunConfig(dataset="digits", clients=8, split="dirichlet:0.5", ratio=0.5, rounds=2,
                    arch="lenet", target_size=300, seeds=[0], epochs=2, batch_size=32)
    result = run_fedavg(cfg)
    export_received(result, root / "received")
    export_target(result, root / "target.h5")
    return root / "received", root / "target.h5", result


@pytest.fixture(scope="session")
def digits_oneshot(tmp_path_factory):
    """Received models of one round of 6 LeNet parties trained well on digits (Dir 5.0) and
    a 300-sample target: good enough that a relabelled party stands out."""
    root = tmp_path_factory.mktemp("oneshot")
    cfg = RunConfig(dataset="digits", clients=6, split="dirichlet:5.0", ratio=1.0, rounds=1,
                    arch="lenet", target_size=300, seeds=[0], epochs=10, batch_size=16,
                    lr=0.05)
    result = run_fedavg(cfg)
    export_received(result, root / "received")
    export_target(result, root / "target.h5")
    return root / "received", root / "target.h5"
