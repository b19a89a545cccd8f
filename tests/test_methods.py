"""Server strategies (mrtf.federated.methods): the dead-network warning of in-loop refinement."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from mrtf.federated.methods import (
    ClientUpdate,
    MethodSettings,
    ServerContext,
    input_independent,
    make_strategy,
)
from mrtf.federated.runner import RunConfig, RunHooks, run
from mrtf.federated.strategies import refinery
from mrtf.io.hdf5 import ArraySource
from mrtf.models import build_model


def test_input_independent():
    row = np.array([[0.1, 0.9]], dtype=np.float32)
    assert input_independent(np.repeat(row, 5, axis=0))
    assert not input_independent(np.array([[0.1, 0.9], [0.2, 0.8]]))
    assert not input_independent(row)  # one sample says nothing


def _context(keep: bool) -> ServerContext:
    x = load_digits().images[:120, None].astype(np.float32) / 16.0
    settings = MethodSettings(refine_steps=5, keep_training_on_average=keep)
    return ServerContext(arch="lenet", num_classes=10, arch_kwargs={"image_size": 8},
                         image_shape=(1, 8, 8), target=ArraySource(x), client_sizes=[50, 50],
                         seed=0, device=torch.device("cpu"), settings=settings)


def _updates(dead: bool) -> list[ClientUpdate]:
    out = []
    for k in range(2):
        torch.manual_seed(k)
        state = build_model("lenet", 10, image_size=8).state_dict()
        if dead:  # every ReLU after the second convolution is off for any input
            state["body.3.bias"] = torch.full_like(state["body.3.bias"], -1e4)
        out.append(ClientUpdate(k, state, 50, [5] * 10, 1.0))
    return out


@pytest.mark.parametrize("dead, keep, warned", [(True, False, True), (False, False, False),
                                                 (True, True, False)])
def test_refinery_warns_when_it_sends_a_dead_model(dead, keep, warned):
    strategy = make_strategy("feddf", _context(keep))
    updates = _updates(dead)
    agg = strategy.aggregate(0, updates[0].state, updates, evaluate=True)
    assert bool(agg.warnings) == warned
    if warned:
        assert "round 1" in agg.warnings[0] and "--keep-training-on-average" in agg.warnings[0]


def test_run_passes_the_first_warning_of_each_track(tmp_path, monkeypatch):
    monkeypatch.setattr(refinery, "input_independent", lambda probs: True)
    seen: list[str] = []
    cfg = RunConfig(dataset="digits", clients=4, split="label:2", ratio=0.5, rounds=2,
                    local_steps=2, arch="lenet", target_size=100, methods=["fedavg", "feddf"],
                    seeds=[0, 1], refine_steps=2)
    run(cfg, tmp_path / "run", hooks=RunHooks(on_warning=seen.append))
    assert [w.split(":")[0] for w in seen] == ["seed 0, feddf", "seed 1, feddf"]


def test_adaptive_in_the_loop_trains_on_the_average_and_never_warns():
    """Do no harm: with dead parties feddf sends its dead refined model (and warns); the
    default's clients always train on the plain average, and the refined model is scored."""
    for dead in (True, False):
        updates = _updates(dead=dead)
        agg = make_strategy("adaptive", _context(False)).aggregate(0, updates[0].state,
                                                                    updates, evaluate=True)
        assert not agg.warnings and "refined" in agg.probs
        assert all(torch.equal(agg.state[k], agg.states["averaged"][k]) for k in agg.state)


def test_the_method_table_has_one_row_per_method():
    from mrtf.federated.methods import METHODS, TABLE

    ctx = _context(False)
    for method in METHODS:
        strategy = make_strategy(method, ctx)
        assert type(strategy) is TABLE[method].strategy and strategy.name == method
    with pytest.raises(ValueError, match="unknown method"):
        make_strategy("nope", ctx)
