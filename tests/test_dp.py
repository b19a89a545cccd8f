"""DP on the uploads (mrtf.federated.strategies.dp): clip + noise, as a wrapper of any strategy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mrtf.federated.methods import (
    METHODS,
    Aggregated,
    ClientUpdate,
    MethodSettings,
    ServerContext,
    Strategy,
    make_strategy,
)
from mrtf.federated.strategies.dp import DifferentialPrivacy, privatize
from mrtf.io.hdf5 import ArraySource
from mrtf.models import build_model


def test_dp_noise_has_the_configured_sigma():
    start = {"w": torch.zeros(200, 500), "n": torch.zeros((), dtype=torch.long)}
    gen = torch.Generator().manual_seed(0)
    noisy = privatize(start, {k: v.clone() for k, v in start.items()}, 0.05, 0.0, gen)
    assert abs(float(noisy["w"].std()) - 0.05) < 0.002 and abs(float(noisy["w"].mean())) < 0.002
    assert noisy["n"] == 0
    # clipping: an update of norm 10 becomes norm 1 before the (zero) noise
    state = {"w": torch.full((100,), 1.0), "n": start["n"]}
    clipped = privatize({"w": torch.zeros(100), "n": start["n"]}, state, 0.0, 1.0, gen)
    assert float(clipped["w"].norm()) == pytest.approx(1.0, rel=1e-5)


def _ctx() -> ServerContext:
    x = np.random.default_rng(0).random((40, 1, 8, 8), dtype=np.float32)
    settings = MethodSettings(refine_steps=2, fusion_iterations=1, fusion_student_steps=1,
                              fusion_batch=8)
    return ServerContext(arch="mlp", num_classes=10,
                         arch_kwargs={"in_channels": 1, "image_size": 8},
                         image_shape=(1, 8, 8), target=ArraySource(x), client_sizes=[30, 30],
                         seed=0, device=torch.device("cpu"), settings=settings)


def _state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return build_model("mlp", 10, in_channels=1, image_size=8).state_dict()


class Spy(Strategy):
    """Records what it was given."""

    name = "spy"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.seen: list[ClientUpdate] = []
        self.marker = 42

    def aggregate(self, rnd, start_state, updates, evaluate):
        self.seen = updates
        return super().aggregate(rnd, start_state, updates, evaluate)

    def state_tensors(self):
        return {"x": torch.ones(1)}


def test_the_wrapped_strategy_sees_clipped_updates_and_the_export_sees_them_too():
    start = _state(9)
    updates = [ClientUpdate(k, _state(k), 30, [3] * 10, 0.5) for k in range(2)]
    spy = Spy(_ctx())
    dp = DifferentialPrivacy(spy, sigma=0.0, clip=0.5)
    agg = dp.aggregate(0, start, updates, evaluate=True)
    for u, seen in zip(updates, spy.seen):
        assert seen.client == u.client and seen.n_samples == u.n_samples
        delta = torch.cat([(seen.state[k] - start[k]).flatten() for k in start])
        assert float(delta.norm()) == pytest.approx(0.5, rel=1e-4)
    assert agg.updates is spy.seen  # what the server received, for the export listener
    assert dp.name == "spy" and dp.marker == 42 and set(dp.state_tensors()) == {"x"}
    # the noise of a client does not depend on who else took part
    one = DifferentialPrivacy(Spy(_ctx()), sigma=0.1).privatize(3, start, updates[1:])
    two = DifferentialPrivacy(Spy(_ctx()), sigma=0.1).privatize(3, start, updates)
    assert all(torch.equal(one[0].state[k], two[1].state[k]) for k in start)


@pytest.mark.parametrize("method", METHODS)
def test_wraps_every_method(method):
    ctx = _ctx()
    start = _state(9)
    updates = [ClientUpdate(k, _state(k), 30, [3] * 10, 0.5) for k in range(2)]
    plain = make_strategy(method, ctx)
    dp = DifferentialPrivacy(make_strategy(method, ctx), sigma=1e-3, clip=1.0)
    assert isinstance(dp, Strategy) and dp.name == plain.name == method
    dp.initialize(start)
    agg = dp.aggregate(0, start, updates, evaluate=True)
    assert isinstance(agg, Aggregated) and set(agg.state) == set(start)
    assert [u.client for u in agg.updates] == [0, 1]
    key = next(k for k, v in start.items() if v.is_floating_point())
    assert not torch.equal(agg.updates[0].state[key], updates[0].state[key])  # noise added
    tensors, extra = dp.state_tensors(), dp.state_json()
    dp.load_state_tensors(tensors, extra)  # checkpoints go to the wrapped strategy
