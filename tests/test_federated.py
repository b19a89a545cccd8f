import numpy as np
import pytest
import torch

from mrtf.data import load_builtin
from mrtf.errors import InputError
from mrtf.federated import (
    LocalConfig,
    RunConfig,
    accuracy,
    average_received,
    average_states,
    local_train,
)
from mrtf.io import load_received
from mrtf.models import build_model


def test_average_states_weighted():
    a = {"w": torch.tensor([0.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([4.0, 6.0]), "n": torch.tensor(5)}
    avg = average_states([a, b], [1, 3])
    torch.testing.assert_close(avg["w"], torch.tensor([3.0, 5.0]))
    assert int(avg["n"]) == 5
    torch.testing.assert_close(average_states([a, b])["w"], torch.tensor([2.0, 4.0]))


def test_local_training_learns_and_reports():
    d = load_builtin("digits")
    x, y = torch.from_numpy(d.x[:600]), torch.from_numpy(d.y[:600])
    torch.manual_seed(0)
    model = build_model("lenet", 10, in_channels=1, image_size=8)
    before = accuracy(model, x, y)
    res = local_train(model, x, y, 10, LocalConfig(epochs=8, batch_size=32), seed=0)
    assert accuracy(res.model, x, y) > max(0.6, before + 0.3)
    assert res.label_counts == np.bincount(d.y[:600], minlength=10).tolist()
    assert res.n_samples == 600 and np.isfinite(res.train_loss)
    # The input model is untouched.
    assert accuracy(model, x, y) == before


def test_fedprox_term_keeps_model_closer():
    d = load_builtin("digits")
    x, y = torch.from_numpy(d.x[:300]), torch.from_numpy(d.y[:300])
    torch.manual_seed(0)
    model = build_model("mlp", 10, in_channels=1, image_size=8)
    vector = torch.nn.utils.parameters_to_vector
    start = vector(model.parameters()).detach()

    def drift(mu):
        local = LocalConfig(steps=30, mu=mu, batch_size=64)  # the batch this was set with
        res = local_train(model, x, y, 10, local, seed=0)
        return float((vector(res.model.parameters()).detach() - start).norm())

    assert drift(1.0) < drift(0.0)


def test_run_config_validation():
    with pytest.raises(InputError, match="R·K < 1"):
        RunConfig(dataset="digits", clients=4, ratio=0.1).validate()
    with pytest.raises(InputError, match="bad split"):
        RunConfig(dataset="digits", split="dirichlet:-1").validate()


def test_exported_federation(digits_federation):
    received_dir, _, result = digits_federation
    rs = load_received(received_dir)
    assert len(rs.by_role("local")) == 4 and len(rs.by_role("global")) == 1
    local = rs.by_role("local")
    assert all(m.meta.label_counts is not None and m.meta.round == 1 for m in local)
    assert sum(m.meta.n_samples for m in local) == sum(sum(m.meta.label_counts) for m in local)
    # The sample-weighted average of the exported files is the simulation's θ_{t+1}.
    avg, _ = average_received(local)
    for key, value in result.global_state.items():
        torch.testing.assert_close(avg.state_dict()[key], value)


def test_export_history_keeps_latest_model_per_client(tmp_path):
    from mrtf.federated import export_received, run_fedavg
    from mrtf.refinery import newest_locals

    cfg = RunConfig(dataset="digits", clients=4, split="iid", ratio=0.5, rounds=3, arch="mlp",
                    target_size=100, seeds=[0], local_steps=2)
    result = run_fedavg(cfg)
    export_received(result, tmp_path / "last")
    export_received(result, tmp_path / "hist", history=True)
    last, hist = load_received(tmp_path / "last"), load_received(tmp_path / "hist")
    assert len(last.by_role("local")) == 2
    trained = {k for k in result.latest}
    assert {m.name for m in hist.by_role("local")} == {f"client-{k:03d}" for k in trained}
    assert all(m.meta.round == result.latest[int(m.name[-3:])][0]
               for m in hist.by_role("local"))
    # S_t for the refinery is the newest round's models only.
    assert {m.name for m in newest_locals(hist)} == {m.name for m in last.by_role("local")}
