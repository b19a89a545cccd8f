"""fit.settle: the adapted model distilled to its own neighbour vote, in rounds (three for a
network with BatchNorm, one without), each round voting with the last round's model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mrtf.refinery.fit as fit
from mrtf.io.hdf5 import ArraySource
from mrtf.models.registry import build_model
from mrtf.refinery.config import RefineConfig


def test_rounds_by_architecture() -> None:
    assert fit.settle_rounds(build_model("lenet_shot", 10)) == fit.SETTLE_ROUNDS == 3
    assert fit.settle_rounds(build_model("lenet", 10)) == 1


@pytest.mark.parametrize("arch, min_rounds", [("lenet_shot", 1), ("lenet", 1),
                                              ("lenet", fit.VOTE_SETTLE_ROUNDS),
                                              ("lenet_shot", fit.VOTE_SETTLE_ROUNDS)])
def test_each_round_votes_with_the_model_the_last_round_distilled(arch, min_rounds,
                                                                  monkeypatch) -> None:
    """The architecture's rounds, or ``min_rounds`` where more (the vote's student adapted:
    option adapt_vote)."""
    torch.manual_seed(0)
    model = build_model(arch, 10)
    x = np.random.default_rng(0).random((48, 1, 28, 28), dtype=np.float32)
    voted_with: list[int] = []
    seeds: list[int] = []
    real_vote, real_distill = fit.final_probs, fit.distill

    def vote(m, *args, **kwargs):
        voted_with.append(id(m))
        return real_vote(m, *args, **kwargs)

    def distill(m, source, targets, run, *args, **kwargs):
        seeds.append(run.seed)
        return real_distill(m, source, targets, run, *args, **kwargs)

    monkeypatch.setattr(fit, "final_probs", vote)
    monkeypatch.setattr(fit, "distill", distill)
    config = RefineConfig(steps=2, batch_size=16, seed=5, progress=False)
    settled = fit.settle(model, ArraySource(x), config, torch.device("cpu"), min_rounds)
    rounds = max(fit.settle_rounds(model), min_rounds)
    assert rounds == {("lenet_shot", 1): 3, ("lenet", 1): 1, ("lenet", 2): 2,
                      ("lenet_shot", 2): 3}[arch, min_rounds]
    assert len(voted_with) == len(seeds) == rounds
    assert seeds == [5 + 1000 * (r + 1) for r in range(rounds)]  # round 1 as before
    assert settled is model  # distilled in place, round after round


def test_no_jitter_or_no_vote_leaves_the_model_alone() -> None:
    model = build_model("lenet_shot", 10)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = np.zeros((8, 1, 28, 28), np.float32)
    out = fit.settle(model, ArraySource(x), RefineConfig(neighbour_vote=0, progress=False),
                     torch.device("cpu"))
    assert out is model
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
