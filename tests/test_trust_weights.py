"""mrtf.trust.weights: what the weights alone say (synthetic state dicts; the real-data
checks are in test_trust_reliability.py)."""

from __future__ import annotations

import numpy as np
import torch

from mrtf.trust.weights import (
    output_rows,
    renamed_outputs,
    row_renaming,
    same_layout,
    weight_geometry,
)

C = 10


def _state(g: torch.Generator, scale: float = 1.0) -> dict[str, torch.Tensor]:
    return {"body.weight": torch.randn(16, 8, generator=g) * scale,
            "head.weight": torch.randn(C, 16, generator=g) * scale,
            "head.bias": torch.randn(C, generator=g) * scale,
            "steps": torch.tensor(3)}


def _update(start: dict, g: torch.Generator, size: float = 0.1) -> dict:
    """A party a small step away from θ_t (one local epoch)."""
    return {k: v + size * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
            for k, v in start.items()}


def _rolled(state: dict) -> dict:
    out = dict(state)
    out["head.weight"] = state["head.weight"].roll(1, 0)
    out["head.bias"] = state["head.bias"].roll(1, 0)
    return out


def test_output_rows_are_the_last_c_row_weight_with_its_bias():
    s = _state(torch.Generator().manual_seed(0))
    rows = output_rows(s, C)
    assert rows.shape == (C, 17)
    np.testing.assert_array_equal(rows[:, -1], s["head.bias"].double().numpy())
    assert output_rows(s, 7) is None  # no layer with 7 rows


def test_a_weight_norm_scale_after_the_head_is_not_the_output_layer():
    """SHOT's weight-normalised head stores g (C, 1) after its weight: the rows are the
    weight's, not the per-class magnitudes (which made every clean party look renamed)."""
    from mrtf.models import build_model

    state = build_model("lenet_shot", num_classes=10).state_dict()
    assert list(state)[-1] == "classifier.weight_g" and state["classifier.weight_g"].shape == \
        (10, 1)
    rows = output_rows(state, 10)
    assert rows.shape == (10, state["classifier.weight"].shape[1] + 1)
    np.testing.assert_array_equal(rows[:, :-1], state["classifier.weight"].double().numpy())


def test_row_renaming_counts_moved_rows_and_their_cost():
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(C, 5))
    assert row_renaming(rows + 0.01 * rng.normal(size=rows.shape), rows) == (0, 1.0)
    assert row_renaming(rows, rows) == (0, 1.0)  # zero distance: nothing to rename
    moved, cost = row_renaming(np.roll(rows, 1, 0), rows)
    assert moved == C and cost < 1e-12
    swapped = rows.copy()
    swapped[[0, 1]] = swapped[[1, 0]]
    assert row_renaming(swapped, rows)[0] == 2


def test_a_renamed_party_is_found_against_theta_t():
    g = torch.Generator().manual_seed(1)
    start = _state(g)
    parties = [_update(start, g) for _ in range(5)]
    parties[2] = _rolled(parties[2])
    found, against = renamed_outputs(parties, C, start)
    assert against == "the starting model's"
    assert [m for m, _ in found] == [0, 0, C, 0, 0]
    assert found[2][1] < 0.1


def test_without_theta_t_the_others_median_is_the_reference():
    g = torch.Generator().manual_seed(2)
    start = _state(g)
    parties = [_update(start, g) for _ in range(5)]
    parties[0] = _rolled(parties[0])
    found, against = renamed_outputs(parties, C)
    assert against == "the other parties' median"
    assert found[0][0] == C and all(m == 0 for m, _ in found[1:])
    # a θ_t of another layout is no reference: the median is used
    other = {k: v for k, v in start.items() if k != "body.weight"}
    assert renamed_outputs(parties, C, other)[1] == "the other parties' median"


def test_nothing_is_measured_where_it_cannot_be():
    g = torch.Generator().manual_seed(3)
    a, b = _state(g), _state(g)
    assert renamed_outputs([a, b], C) is None  # two parties, no θ_t: no median of others
    assert renamed_outputs([a, b], C, _state(g)) is not None
    odd = dict(b)
    odd["head.weight"] = torch.randn(C, 17, generator=g)
    assert not same_layout([a, odd])
    assert renamed_outputs([a, odd, _state(g)], C) is None
    assert renamed_outputs([a, b, _state(g)], 7) is None


def test_weight_geometry_names_a_scaled_party():
    g = torch.Generator().manual_seed(4)
    start = _state(g)
    parties = [_update(start, g) for _ in range(5)]
    parties[4] = {k: v * 100 if v.is_floating_point() else v for k, v in parties[4].items()}
    dist, norm = weight_geometry(parties)
    assert dist[4] > 10 and norm[4] > 10
    assert max(dist[:4]) < 4 and all(0.5 < n < 2 for n in norm[:4])
    assert weight_geometry(parties[:2]) is None
