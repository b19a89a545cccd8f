"""mrtf.trust.selection: no single received file takes over (issue 35), on real digits parties.

The received set is the ``digits_oneshot`` fixture (6 LeNet parties trained well on sklearn
digits, and θ_t); an attacker changes or adds files in memory as bench/poison.py does.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from mrtf.io.bundles import ReceivedModel, ReceivedSet, load_received
from mrtf.io.hdf5 import H5Dataset
from mrtf.refinery import RefineConfig, accuracy_of, refine
from mrtf.refinery.teachers import newest_global, newest_locals, teacher_logits
from mrtf.trust.parties import describe, plan_parties
from mrtf.trust.reliability import assess
from mrtf.trust.selection import behaviour_copies, copy_groups, select

ROUND_1E6 = 10**6 - 1  # 0-based in memory: files say round 10^6


def rolled(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same model predicting y + 1: its output layer's class rows rolled by one."""
    out = dict(state)
    last = [n for n, v in state.items() if v.dim() == 2][-1]
    for n in (last, last.replace("weight", "bias")):
        out[n] = state[n].roll(1, 0)
    return out


def noisy(state: dict[str, torch.Tensor], scale: float, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * v.std() * torch.randn(v.shape, generator=g)
            if v.is_floating_point() and v.numel() > 1 else v for k, v in state.items()}


def copies(m: ReceivedModel, state, n: int, **meta) -> list[ReceivedModel]:
    return [ReceivedModel(m.path.with_name(f"sybil-{j}.safetensors"),
                          replace(m.meta, party=f"sybil-{j}", **meta), state(j))
            for j in range(n)]


@pytest.fixture(scope="module")
def clean(digits_oneshot) -> ReceivedSet:
    return load_received(digits_oneshot[0])


def locals_of(rs: ReceivedSet) -> list[ReceivedModel]:
    return [m for m in rs.models if m.meta.role == "local"]


def with_models(rs: ReceivedSet, models: list[ReceivedModel]) -> ReceivedSet:
    return ReceivedSet(models, [])


def test_clean_set_uses_everything(clean):
    sel = select(clean)
    assert len(sel.locals_) == 6 and sel.start is not None
    assert sel.suspicious == [] and sel.copies == []
    assert all(f.used for f in sel.files)


def test_round_claim_is_refused_and_named(clean):
    m = locals_of(clean)[0]
    bad = ReceivedModel(m.path, replace(m.meta, round=ROUND_1E6), rolled(m.state_dict))
    rs = with_models(clean, [bad, *clean.models[1:]])
    sel = select(rs)
    assert bad not in sel.locals_ and len(sel.locals_) == 5
    assert sel.round == 0 and sel.start is not None  # the honest round and its θ_t
    assert len(sel.suspicious) == 1 and m.path.name in sel.suspicious[0]
    assert "round 1000000" in sel.suspicious[0]
    # the refinery's names for the rule are thin calls of it
    assert newest_locals(rs) == sel.locals_ and newest_global(rs) is sel.start
    rows = plan_parties(rs, "refine")
    row = next(r for r in rows if r.file == m.path.name)
    assert not row.used and row.suspicious
    assert sum(r.used for r in rows) == 6  # 5 parties and θ_t
    _, warned = describe(rows)
    assert warned and m.path.name in warned[0]


def test_a_newer_round_of_most_parties_is_the_newest(clean):
    """An honest history: every party sent round 1 and round 2; round 2 teaches."""
    later = [ReceivedModel(m.path.with_name(f"r2-{m.path.name}"), replace(m.meta, round=1),
                           noisy(m.state_dict, 0.5, i))
             for i, m in enumerate(locals_of(clean))]
    sel = select(with_models(clean, [*clean.models, *later]))
    assert sel.round == 1 and sel.locals_ == later
    assert sel.suspicious == []
    older = [f for f in sel.not_used if f.role == "local"]
    assert len(older) == 6 and all("older" in f.why for f in older)


def test_posing_as_a_later_start_is_refused(clean):
    m = locals_of(clean)[0]
    fake = ReceivedModel(m.path, replace(m.meta, role="global", round=3), rolled(m.state_dict))
    sel = select(with_models(clean, [fake, *clean.models[1:]]))
    honest = next(x for x in clean.models if x.meta.role == "global")
    assert sel.start is honest
    assert any(m.path.name in s and "θ_t of round 4" in s for s in sel.suspicious)


def test_a_replaced_start_is_refused_by_its_rows(clean):
    """θ_t's own file carries a party's model with its class rows rolled: no round claim
    gives it away, its output layer does."""
    m = locals_of(clean)[0]
    models = [ReceivedModel(x.path, x.meta, rolled(m.state_dict)) if x.meta.role == "global"
              else x for x in clean.models]
    sel = select(with_models(clean, models))
    assert sel.start is None and len(sel.locals_) == 6
    assert any("class rows swapped" in s for s in sel.suspicious)


def test_two_starts_of_one_round_are_both_refused(clean):
    honest = next(x for x in clean.models if x.meta.role == "global")
    twin = ReceivedModel(honest.path.with_name("other-start.safetensors"), honest.meta,
                         noisy(honest.state_dict, 0.1, 0))
    sel = select(with_models(clean, [*clean.models, twin]))
    assert sel.start is None
    assert sum("none is trusted as the start" in s for s in sel.suspicious) == 2


@pytest.mark.parametrize("noise", [0.0, 1e-3])
def test_copies_under_other_names_count_once(clean, noise):
    m = locals_of(clean)[1]
    syb = copies(m, lambda j: noisy(m.state_dict, noise, j) if noise else dict(m.state_dict), 5)
    rs = with_models(clean, [*syb, *clean.models[1:]])
    sel = select(rs)
    assert len(sel.copies) == 1 and len(sel.copies[0]) == 6  # 5 sybils and the party itself
    assert len(sel.locals_) == 5  # parties 1-5, party 1 once
    assert sum(f.suspicious for f in sel.files) == 5


def test_honest_parties_are_not_copies(clean):
    states = [m.state_dict for m in locals_of(clean)]
    assert copy_groups(states) == []


def test_near_copies_claiming_a_round_do_not_outvote(clean):
    """5 near-copies claiming round 10^6 beside 5 honest parties of round 1: as 5 votes they
    would hold the newest round; counted once, their claim is refused."""
    m = locals_of(clean)[0]
    syb = copies(m, lambda j: noisy(rolled(m.state_dict), 1e-3, j), 5, round=ROUND_1E6)
    sel = select(with_models(clean, [*syb, *clean.models[1:]]))
    assert sel.round == 0 and len(sel.locals_) == 5
    assert sum(f.suspicious for f in sel.files) == 5


def test_behaviour_copies(clean, digits_oneshot):
    with H5Dataset(digits_oneshot[1]) as src:
        lg = teacher_logits([m.build() for m in locals_of(clean)], src).logits
    assert behaviour_copies(lg) == []
    assert behaviour_copies(np.concatenate([lg, lg[2:3] + 1e-4])) == [[2, 6]]


def test_a_start_that_would_exclude_most_parties_is_refused(clean, digits_oneshot):
    """Given a rolled θ_t anyway, the renamed-rows check would call every party renamed: the
    reference is refused instead, and no party is excluded."""
    locs = locals_of(clean)
    with H5Dataset(digits_oneshot[1]) as src:
        lg = teacher_logits([m.build() for m in locs], src).logits
    report = assess([m.name for m in locs], lg, [m.state_dict for m in locs],
                    reference=rolled(locs[0].state_dict))
    assert report.excluded == []
    assert any("θ_t refused" in n for n in report.notes)


def test_refine_with_a_round_claim_keeps_its_labels(clean, digits_oneshot):
    """End to end: the default's labels with the round-claim attacker are within 2 points of
    the clean set's, and the refused file is named in the notes."""
    m = locals_of(clean)[0]
    bad = ReceivedModel(m.path, replace(m.meta, round=ROUND_1E6), rolled(m.state_dict))
    cfg = RefineConfig(seed=0, progress=False, steps=100)  # short: both sets alike
    with H5Dataset(digits_oneshot[1]) as src:
        y = src.labels()
        base = accuracy_of(refine(clean, src, cfg).probs, y)
        res = refine(with_models(clean, [bad, *clean.models[1:]]), src, cfg)
    assert accuracy_of(res.probs, y) >= base - 0.02
    assert any(n.startswith("refused: ") and m.path.name in n for n in res.notes)
    assert res.teachers == 5


def test_many_files_are_compared_without_a_quadratic_cost():
    """3,000 small files (too many to compare pairwise): exact copies are still found."""
    g = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(4, generator=g)} for _ in range(3000)]
    states.append({"w": states[7]["w"].clone()})
    assert copy_groups(states) == [[7, 3000]]
