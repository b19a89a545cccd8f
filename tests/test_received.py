"""One constructor of a round's ReceivedSet (mrtf.federated.received), and its export."""

from __future__ import annotations

import math

import torch

from mrtf.federated.received import received_set, write_received
from mrtf.federated.strategies.base import ClientUpdate
from mrtf.io import load_received
from mrtf.models import build_model

KW = dict(arch="mlp", num_classes=10, arch_kwargs={"in_channels": 1, "image_size": 8})


def _state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return build_model("mlp", 10, in_channels=1, image_size=8).state_dict()


def _update(k: int, loss: float = 0.5) -> ClientUpdate:
    return ClientUpdate(k, _state(k), 10 + k, [1 + k] + [1] * 9, loss)


def test_round_states_become_a_received_set():
    earlier = {4: (0, _update(4)), 2: (0, _update(2))}  # client 2 trained again in round 1
    rs = received_set(1, _state(99), [_update(2), _update(7, math.nan)], earlier=earlier,
                      extra={"mrtf.note": "x"}, **KW)
    assert [m.path.name for m in rs.models] == ["client-002.safetensors",
                                                "client-004.safetensors",
                                                "client-007.safetensors",
                                                "global-start.safetensors"]
    local = {m.name: m.meta for m in rs.by_role("local")}
    assert {n: m.round for n, m in local.items()} == {"client-002": 1, "client-004": 0,
                                                       "client-007": 1}
    assert local["client-007"].train_loss is None  # no finite loss: not claimed
    assert local["client-002"].n_samples == 12 and local["client-002"].label_counts[0] == 3
    (glob,) = rs.by_role("global")
    assert glob.meta.party == "server" and glob.meta.round == 1
    assert all(m.meta.extra == {"mrtf.note": "x"} for m in rs.models)
    assert received_set(1, None, [_update(2)], **KW).by_role("global") == []


def test_written_set_reads_back_the_same(tmp_path):
    rs = received_set(0, _state(99), [_update(1), _update(3)], **KW)
    paths = write_received(rs, tmp_path / "recv")
    assert [p.name for p in paths] == [m.path.name for m in rs.models]
    back = load_received(tmp_path / "recv")
    assert [(m.name, m.meta.role, m.meta.round, m.meta.n_samples) for m in back.models] == \
        [(m.name, m.meta.role, m.meta.round, m.meta.n_samples) for m in rs.models]
    for a, b in zip(rs.models, back.models):
        assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
