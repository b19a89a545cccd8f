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


@pytest.mark.parametrize("arch, schedule", [("lenet_shot", fit.AdaptSchedule()),
                                            ("lenet", fit.AdaptSchedule()),
                                            ("lenet", fit.VOTE_SCHEDULE),
                                            ("lenet_shot", fit.VOTE_SCHEDULE)])
def test_each_round_votes_with_the_model_the_last_round_distilled(arch, schedule,
                                                                  monkeypatch) -> None:
    """The architecture's rounds, or the schedule's ``min_rounds`` where more (the vote's
    student adapted: option adapt_vote), each distilling for the schedule's share of the
    steps."""
    torch.manual_seed(0)
    model = build_model(arch, 10)
    x = np.random.default_rng(0).random((48, 1, 28, 28), dtype=np.float32)
    voted_with: list[int] = []
    seeds: list[int] = []
    steps: list[int] = []
    real_vote, real_distill = fit.final_probs, fit.distill

    def vote(m, *args, **kwargs):
        voted_with.append(id(m))
        return real_vote(m, *args, **kwargs)

    def distill(m, source, targets, run, *args, **kwargs):
        seeds.append(run.seed)
        steps.append(run.steps)
        return real_distill(m, source, targets, run, *args, **kwargs)

    monkeypatch.setattr(fit, "final_probs", vote)
    monkeypatch.setattr(fit, "distill", distill)
    config = RefineConfig(steps=4, batch_size=16, seed=5, progress=False)
    settled = fit.settle(model, ArraySource(x), config, torch.device("cpu"), schedule)
    rounds = max(fit.settle_rounds(model), schedule.min_rounds)
    assert rounds == {("lenet_shot", 1): 3, ("lenet", 1): 1, ("lenet", 2): 2,
                      ("lenet_shot", 2): 3}[arch, schedule.min_rounds]
    assert len(voted_with) == len(seeds) == rounds
    assert seeds == [5 + 1000 * (r + 1) for r in range(rounds)]  # round 1 as before
    assert steps == [4 if schedule.settle_share == 1.0 else 2] * rounds
    assert settled is model  # distilled in place, round after round


def test_no_jitter_or_no_vote_leaves_the_model_alone() -> None:
    model = build_model("lenet_shot", 10)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = np.zeros((8, 1, 28, 28), np.float32)
    out = fit.settle(model, ArraySource(x), RefineConfig(neighbour_vote=0, progress=False),
                     torch.device("cpu"))
    assert out is model
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("m, expected", [(1000, 125), (10_000, 157), (100, 125), (10, 125)])
def test_refreshes_capped_by_the_run_not_the_pass(m, expected) -> None:
    """At most four refreshes of SHOT's pseudo-labels in a 500-step run: every 125 steps
    where a pass over the target is shorter (1,000 samples: 16 steps a pass), every pass
    where it is longer (10,000 samples: 157 steps)."""
    from mrtf.refinery.shot import ShotSettings

    settings = ShotSettings(steps=500, batch_size=64)
    capped = fit.refreshed_at_most(settings, m, 4)
    assert capped.refresh_every == expected
    assert fit.refreshed_at_most(settings, m, 0) is settings  # 0: SHOT's own, once a pass
    passes = -(-capped.num_steps(m) // capped.refresh_every)
    assert passes <= 4


def test_the_vote_schedule_runs_shot_with_capped_refreshes(monkeypatch) -> None:
    """adapt_student hands SHOT the capped settings and settle the schedule."""
    seen = {}

    def shot(model, source, settings, *args, **kwargs):
        seen["every"] = settings.refresh_every
        return model

    def settle(model, source, config, dev, schedule):
        seen["schedule"] = schedule
        return model

    monkeypatch.setattr(fit, "shot_adapt", shot)
    monkeypatch.setattr(fit, "settle", settle)
    model = build_model("lenet", 10)
    x = np.zeros((1000, 1, 28, 28), np.float32)
    config = RefineConfig(steps=500, progress=False)
    assert fit.adapt_student(model, ArraySource(x), config, torch.device("cpu"),
                             schedule=fit.VOTE_SCHEDULE) is model
    assert seen == {"every": 125, "schedule": fit.VOTE_SCHEDULE}
    fit.adapt_student(model, ArraySource(x), config, torch.device("cpu"))
    assert seen == {"every": 0, "schedule": fit.AdaptSchedule()}  # the adapt branch: as SHOT
