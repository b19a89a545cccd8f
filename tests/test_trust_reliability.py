"""mrtf.trust.reliability and robust aggregation: a clean set is not flagged, every poison kind
is, on small real data (scikit-learn digits, one round of 6 LeNet parties)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from mrtf.averaging import aggregate_states, parse_aggregate
from mrtf.errors import InputError
from mrtf.io import H5Dataset, load_received
from mrtf.io.bundles import ReceivedModel, ReceivedSet
from mrtf.refinery import RefineConfig, refine
from mrtf.refinery.assess import assess_received
from mrtf.trust import assess


@pytest.fixture(scope="module")
def oneshot(digits_oneshot):
    received, target = digits_oneshot
    return load_received(received), target


def _relabelled(state: dict, c: int) -> dict:
    """The same network predicting y + 1: the last layer's rows rolled by one class."""
    out = dict(state)
    last_w = [k for k, v in state.items() if v.dim() == 2 and v.shape[0] == c][-1]
    last_b = last_w.replace("weight", "bias")
    out[last_w] = state[last_w].roll(1, 0)
    out[last_b] = state[last_b].roll(1, 0)
    return out


def poison(rs: ReceivedSet, kind: str) -> ReceivedSet:
    models = list(rs.models)
    m = models[0]
    state, meta = dict(m.state_dict), m.meta
    g = torch.Generator().manual_seed(0)
    if kind == "random":
        state = {k: torch.randn(v.shape, generator=g) if v.is_floating_point() else v
                 for k, v in state.items()}
    elif kind == "x100":
        state = {k: v * 100 if v.is_floating_point() else v for k, v in state.items()}
    elif "flipped" in kind:
        state = _relabelled(state, meta.num_classes)
    if "claims" in kind:
        meta = replace(meta, n_samples=10**6, label_counts=None)
    if "loss-0" in kind:
        meta = replace(meta, train_loss=0.0)
    models[0] = ReceivedModel(m.path, meta, state)
    return ReceivedSet(models, [])


def _report(rs, target):
    with H5Dataset(target) as src:
        return assess_received(rs, src, "cpu")


def test_clean_set_is_not_flagged(oneshot):
    rs, target = oneshot
    report = _report(rs, target)
    assert [p.verdict for p in report.parties] == ["trusted"] * len(report.parties)
    assert abs(sum(report.weights) - 1) < 1e-9


@pytest.mark.parametrize("kind,verdict", [("random", "excluded"), ("x100", "excluded"),
                                          ("flipped", "excluded"), ("claims", "down-weighted"),
                                          ("claims+flipped", "excluded"),
                                          ("loss-0", "down-weighted"),
                                          ("loss-0+flipped", "excluded")])
def test_each_poison_kind_is_named(oneshot, kind, verdict):
    rs, target = oneshot
    report = _report(poison(rs, kind), target)
    flagged = {p.name: p.verdict for p in report.flagged}
    assert flagged == {rs.models[0].name: verdict}, report.rows()
    assert report.parties[0].reasons
    # a claim alone cannot dominate the average: a refused one counts as the median claim
    assert report.weights[0] <= 3.0 * float(np.median(report.weights)) + 1e-9


def test_claimed_loss_of_a_misbehaving_party_is_named():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, 400)
    logits = np.stack([np.eye(10)[y] * 5 + rng.normal(0, 0.5, (400, 10)) for _ in range(6)])
    logits[0] = rng.normal(0, 1, (400, 10))  # agrees with nobody
    report = assess([f"p{i}" for i in range(6)], logits, None, None,
                    [0.0, 0.3, 0.4, 0.35, 0.3, 0.5])
    assert report.parties[0].verdict == "down-weighted"
    assert any("train_loss" in r for r in report.parties[0].reasons)
    assert all(p.verdict == "trusted" for p in report.parties[1:])


def test_refine_default_leaves_excluded_party_out(oneshot):
    rs, target = oneshot
    with H5Dataset(target) as src:
        res = refine(poison(rs, "x100"), src, RefineConfig(steps=5, seed=0, progress=False))
    assert res.parties.verdict_of()[rs.models[0].name] == "excluded"
    assert res.teachers == len(rs.by_role("local")) - 1
    assert any(rs.models[0].name in line for line in res.parties.verdicts)


def test_paper_method_has_no_defence_by_default(oneshot):
    rs, target = oneshot
    with H5Dataset(target) as src:
        res = refine(rs, src, RefineConfig(method="fedavg", seed=0, progress=False))
    assert res.parties is None and "reliability" not in res.to_dict()


def test_aggregates():
    a = {"w": torch.tensor([0.0, 1.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(5)}
    c = {"w": torch.tensor([100.0, 3.0]), "n": torch.tensor(4)}
    assert torch.equal(aggregate_states([a, b, c], aggregate="median")["w"],
                       torch.tensor([1.0, 2.0]))
    assert torch.equal(aggregate_states([a, b, c], aggregate="median")["n"], torch.tensor(5))
    assert torch.allclose(aggregate_states([a, b, c], aggregate="mean")["w"],
                          torch.tensor([101 / 3, 2.0]))
    assert torch.allclose(aggregate_states([a, b, c, b], aggregate="trimmed:0.25")["w"],
                          torch.tensor([1.0, 2.0]))
    assert torch.allclose(aggregate_states([a, b], aggregate="median")["w"],
                          torch.tensor([0.5, 1.5]))
    assert parse_aggregate("trimmed:0.1") == ("trimmed", 0.1)
    for bad in ("max", "trimmed:0.5", "trimmed:x", "trimmed:-0.1", ""):
        with pytest.raises(ValueError):
            parse_aggregate(bad)
    with pytest.raises(InputError):
        RefineConfig(aggregate="mode").validate()


def test_a_weak_party_with_renamed_outputs_is_named_by_its_weights(digits_federation):
    """Parties two short rounds old each predict about one class, so no behavioural check
    can see a relabelling; the output rows, still near θ_t's, show the swap."""
    received, target, _ = digits_federation
    rs = load_received(received)
    clean = _report(rs, target)
    assert all(p.verdict == "trusted" and p.renamed_rows == 0 for p in clean.parties)
    report = _report(poison(rs, "flipped"), target)
    first = report.parties[0]
    assert [p.name for p in report.flagged] == [first.name]
    assert first.verdict == "excluded" and first.renamed_rows == 10
    assert first.reasons == [r for r in first.reasons if "class rows swapped" in r] != []
    assert "the starting model's" in first.reasons[0]
