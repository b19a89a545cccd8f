"""Client algorithms (mrtf.federated.clients): local SGD and SCAFFOLD's control variates."""

from __future__ import annotations

import torch

from mrtf.data import load_builtin
from mrtf.federated.clients import ClientAlgorithm, Scaffold, make_client
from mrtf.federated.local import LocalConfig, local_train
from mrtf.models import build_model

LOCAL = LocalConfig(steps=5, batch_size=16)


def _data():
    d = load_builtin("digits")
    return torch.from_numpy(d.x[:120]), torch.from_numpy(d.y[:120])


def _model():
    torch.manual_seed(0)
    return build_model("mlp", 10, in_channels=1, image_size=8)


def _equal(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_make_client_by_name():
    assert type(make_client("fedavg", LOCAL, 4)) is ClientAlgorithm
    assert type(make_client("fedprox", LOCAL, 4)) is ClientAlgorithm
    assert isinstance(make_client("scaffold", LOCAL, 4), Scaffold)


def test_scaffold_starts_as_sgd_then_corrects_with_its_control_variates():
    x, y = _data()
    model = _model()
    sc = Scaffold(LOCAL, num_clients=4)
    sc.initialize(model)
    plain = local_train(model, x, y, 10, LOCAL, seed=3)
    first = sc.train(0, model, x, y, 10, 3, "cpu")  # c = c_0 = 0: plain local SGD
    assert _equal(first.model.state_dict(), plain.model.state_dict())
    assert all(float(v.abs().sum()) == 0 for v in sc.control.values())  # c moves at round end
    sc.end_round()
    # c ← c + Δc_0 / N, and c_0 = (θ_t − θ_0) / (K·η_eff) after the first round
    eff = LOCAL.steps * LOCAL.lr / (1 - LOCAL.momentum)
    start, new = dict(model.named_parameters()), dict(first.model.named_parameters())
    for n, c0 in sc.client_controls[0].items():
        torch.testing.assert_close(c0, (start[n].detach() - new[n].detach()) / eff)
        torch.testing.assert_close(sc.control[n], c0 / 4)
    again = sc.train(1, model, x, y, 10, 3, "cpu")  # client 1: c − c_1 = c ≠ 0
    assert not _equal(again.model.state_dict(), plain.model.state_dict())


def test_scaffold_state_round_trips():
    x, y = _data()
    model = _model()
    sc = Scaffold(LOCAL, num_clients=2)
    sc.initialize(model)
    sc.train(1, model, x, y, 10, 0, "cpu")
    sc.end_round()
    back = Scaffold(LOCAL, num_clients=2)
    back.load_state(sc.state_tensors(), sc.state_json())
    assert _equal(back.control, sc.control) and set(back.client_controls) == {1}
    assert _equal(back.client_controls[1], sc.client_controls[1])
    assert ClientAlgorithm(LOCAL, 2).state_tensors() == {}
