"""Shared fixtures: small real data (scikit-learn digits) and a tiny simulated federation."""

from __future__ import annotations

import pytest
import torch

from mrtf.federated import LocalConfig, SimulationConfig, export_received, export_target, run_fedavg

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def digits_federation(tmp_path_factory):
    """Received models (4 LeNet clients + θ_t) and a target set from 2 rounds on digits."""
    root = tmp_path_factory.mktemp("fed")
    cfg = SimulationConfig(dataset="digits", clients=8, split="dirichlet:0.5", ratio=0.5,
                           rounds=2, arch="lenet", target_size=300, seed=0,
                           local=LocalConfig(epochs=2, batch_size=32))
    result = run_fedavg(cfg)
    export_received(result, root / "received")
    export_target(result, root / "target.h5")
    return root / "received", root / "target.h5", result
