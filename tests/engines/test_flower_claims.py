"""The Flower server caps claimed sample counts (issue 35): a claim weights a party's model in
the average, so one party claiming 10^12 samples must not become the average."""

from __future__ import annotations

import torch

from mrtf.engines.flower.checks import cap_claims, scaled_counts
from mrtf.engines.flower.roster import Roster
from mrtf.federated.strategies.base import ClientUpdate, average_updates
from mrtf.trust.reliability import CLAIM_CAP


def _update(party: int, n: int, value: float) -> ClientUpdate:
    counts = scaled_counts([1] * 10, n)
    return ClientUpdate(party, {"w": torch.full((3,), value)}, n, counts, 0.5)


def test_a_huge_claim_is_capped_and_named():
    updates = [_update(k, 100, 0.0) for k in range(4)] + [_update(4, 10**12, 1.0)]
    capped, lines = cap_claims(updates, {k: 100 for k in range(5)})
    assert [u.n_samples for u in capped] == [100] * 5  # what it declared when it joined
    assert len(lines) == 1 and lines[0].startswith("party 4 claims 1,000,000,000,000")
    assert sum(capped[4].label_counts) == 100
    avg = average_updates(capped)["w"]
    assert torch.allclose(avg, torch.full((3,), 0.2))


def test_the_round_median_caps_what_the_roster_allows():
    updates = [_update(k, 100, 0.0) for k in range(4)] + [_update(4, 10**6, 1.0)]
    capped, lines = cap_claims(updates, {})  # nothing declared: the round's median rules
    assert capped[4].n_samples == int(CLAIM_CAP * 100) and len(lines) == 1
    honest, lines = cap_claims(updates[:4], {})
    assert honest == updates[:4] and lines == []


def test_scaled_counts_keep_the_sum():
    assert scaled_counts([5, 3, 2], 7) == [4, 2, 1]
    assert sum(scaled_counts([10**11, 1, 5], 300)) == 300


def test_roster_sizes_are_capped():
    roster = Roster({k: k for k in range(4)}, {0: 100, 1: 120, 2: 90, 3: 10**12})
    sizes = roster.client_sizes(5)
    assert sizes[:3] == [100, 120, 90] and sizes[3] == int(CLAIM_CAP * 120) and sizes[4] == 0
