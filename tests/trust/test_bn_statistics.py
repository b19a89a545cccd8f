"""BatchNorm running statistics in the weight checks (mrtf.trust.weights.statistics_norm,
mrtf.trust.reliability): a clean party whose statistics differ (a narrow shard, its own
start) is not a weight-space outlier; forged statistics or scaled weights still are.

The state dicts have the real layout of a BatchNorm CNN (``lenet_shot``), each from its own
random start, with running statistics set as measured on mnist5k (bench/independent_starts.py
seed 1: the narrow party's running variance 2.9×, its running mean 2.2× the others')."""

from __future__ import annotations

import numpy as np
import torch

from mrtf.models import build_model
from mrtf.trust.reliability import assess
from mrtf.trust.weights import is_statistic, statistics_norm, weight_geometry

K, C, M = 5, 10, 300


def _parties() -> list[dict[str, torch.Tensor]]:
    """K lenet_shot state dicts from K seeds, running statistics of one scale (±10 %)."""
    g = torch.Generator().manual_seed(0)
    states = []
    for k in range(K):
        torch.manual_seed(100 + k)
        state = {n: v.clone() for n, v in build_model("lenet_shot", C).state_dict().items()}
        for n, v in state.items():
            if n.endswith("running_var"):
                state[n] = 100 * (1 + 0.1 * torch.rand(v.shape, generator=g))
            elif n.endswith("running_mean"):
                state[n] = 10 * torch.randn(v.shape, generator=g)
        states.append(state)
    return states


def _scaled(state: dict, factor: float, statistics: bool) -> dict:
    """``state`` with its running statistics (or every other floating entry) × factor."""
    return {n: v * factor if v.is_floating_point() and is_statistic(n) == statistics else v
            for n, v in state.items()}


def _agreeing_logits() -> np.ndarray:
    """K parties that agree on most of M samples (clean behaviour)."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=(M, C)) * 3
    return np.stack([base + rng.normal(size=(M, C)) for _ in range(K)])


def test_a_narrow_party_s_statistics_are_not_a_weight_outlier():
    states = _parties()
    narrow = {n: v * (2.9 if n.endswith("running_var") else 2.2)
              if is_statistic(n) else v for n, v in states[3].items()}
    states[3] = narrow
    dist, norm = weight_geometry(states)
    assert max(dist) < 1.5 and max(norm) < 1.5  # the trained parameters alone
    stats = statistics_norm(states)
    assert 2.5 < stats[3] < 3.5 and all(0.8 < s < 1.25 for i, s in enumerate(stats) if i != 3)
    report = assess([f"p{i}" for i in range(K)], _agreeing_logits(), states,
                    shared_start=False)
    assert [p.verdict for p in report.parties] == ["trusted"] * K, report.rows()
    # with the statistics among the weights (before), the narrow party was 5.4× the median
    # distance from the median on mnist5k and excluded; here:
    flat = [torch.cat([v.double().flatten() for v in s.values() if v.is_floating_point()])
            for s in states]
    med = torch.stack(flat).median(0).values
    d = [float((f - med).norm()) for f in flat]
    assert d[3] > 4 * float(np.median(d))


def test_forged_statistics_and_scaled_weights_are_still_excluded():
    names = [f"p{i}" for i in range(K)]
    for factor, statistics, why in [(100.0, True, "BatchNorm running statistics"),
                                    (0.01, True, "BatchNorm running statistics"),
                                    (100.0, False, "weight norm")]:
        states = _parties()
        states[1] = _scaled(states[1], factor, statistics)
        report = assess(names, _agreeing_logits(), states, shared_start=False)
        verdicts = [p.verdict for p in report.parties]
        assert verdicts == ["trusted", "excluded", "trusted", "trusted", "trusted"], \
            report.rows()
        assert any(why in r for r in report.parties[1].reasons), report.parties[1].reasons
    both = _parties()
    both[2] = {n: v * 100 if v.is_floating_point() else v for n, v in both[2].items()}
    report = assess(names, _agreeing_logits(), both, shared_start=True)
    reasons = report.parties[2].reasons
    assert report.parties[2].verdict == "excluded"
    assert any("weight norm" in r for r in reasons) and any("BatchNorm" in r for r in reasons)


def test_models_without_batchnorm_have_no_statistics_check():
    states = [{n: v.clone() for n, v in build_model("lenet", C).state_dict().items()}
              for _ in range(3)]
    assert statistics_norm(states) is None
    assert weight_geometry(states) is not None
    report = assess(["a", "b", "c"], _agreeing_logits()[:3], states)
    assert all(p.statistics_norm is None for p in report.parties)
