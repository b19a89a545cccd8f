"""Weight-space checks of received models (issue 13): what a party's weights say without
running it.

- :func:`weight_geometry`: distance from the parties' coordinate-wise median and weight norm,
  each relative to the median party's (random weights, weights × 100), over the trained
  parameters; :func:`statistics_norm`: the norm of BatchNorm's running statistics, apart
  (they are the party's data seen through its network, not weights: see there).
- :func:`renamed_outputs`: whether a party's output layer is the round's starting model's
  (θ_t's) with its class rows renamed. Swapping the rows of the last layer is the cheapest
  label-flipping attack: no training, and every prediction moves to another class. A trained
  party's relabelling shows in its behaviour (mrtf.trust.reliability's mapped agreement), but
  parties trained for one epoch from θ_t hardly agree with one another on the target
  (agreement 0.00-0.11 on mnist5k), so their behaviour says nothing, while their output rows
  are still θ_t's rows plus a small update: a renamed row lies nearest another class's row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

#: state_dict entries that are BatchNorm's running statistics (``nn.BatchNorm*`` buffers)
STATISTICS = ("running_mean", "running_var")


def is_statistic(name: str) -> bool:
    """Whether the state_dict entry ``name`` is a BatchNorm running statistic."""
    return name.rsplit(".", 1)[-1] in STATISTICS


def weight_geometry(states: Sequence[dict[str, torch.Tensor]]
                    ) -> tuple[list[float], list[float]] | None:
    """(distance from the coordinate-wise median / median distance, norm / median norm) per
    state dict, over its floating-point entries except BatchNorm's running statistics
    (:func:`statistics_norm`); None when fewer than 3 or their keys / shapes differ."""
    if len(states) < 3 or not same_layout(states):
        return None
    keys = [n for n, v in states[0].items() if v.is_floating_point() and not is_statistic(n)]
    if not keys:
        return None
    return _relative_geometry(states, keys)


def statistics_norm(states: Sequence[dict[str, torch.Tensor]]) -> list[float] | None:
    """The norm of each state dict's BatchNorm running statistics / the median party's; None
    when fewer than 3, their layouts differ or they have none.

    Apart from the weights because they are not weights: a running mean and variance are the
    party's own data seen through its network. A party with a narrow shard, or a network
    whose features came out at another scale (parties from their own starts), has its own;
    among flattened weights they outweighed every trained parameter (5 lenet_shot parties
    from 5 seeds on mnist5k, seed 1: a clean party's running variance 2.9× the median party's
    made its "weights" 5.4× the median distance from the median, its parameters alone 0.98×).
    Only their scale is checked (weights × 100 scale them too; a forged variance rescales
    every activation), and a variance scales as the square of the weights that feed it."""
    if len(states) < 3 or not same_layout(states):
        return None
    keys = [n for n, v in states[0].items() if v.is_floating_point() and is_statistic(n)]
    return _relative_geometry(states, keys)[1] if keys else None


def _relative_geometry(states: Sequence[dict[str, torch.Tensor]], keys: list[str]
                       ) -> tuple[list[float], list[float]]:
    """(distance from the coordinate-wise median, norm) of ``keys``' flattened values, each
    relative to the median party's."""
    flat = torch.stack([torch.cat([s[n].detach().double().flatten() for n in keys])
                        for s in states])
    med = flat.median(0).values
    dist = (flat - med).norm(dim=1)
    norm = flat.norm(dim=1)
    d0 = float(dist.median()) or 1e-12
    n0 = float(norm.median()) or 1e-12
    return [float(d) / d0 for d in dist], [float(n) / n0 for n in norm]


def same_layout(states: Sequence[dict[str, torch.Tensor]]) -> bool:
    """Every state dict has the first one's keys, in order, with the same shapes."""
    keys = list(states[0])
    return all(list(s) == keys and all(s[n].shape == states[0][n].shape for n in keys)
               for s in states)


def output_rows(state: dict[str, torch.Tensor], num_classes: int) -> np.ndarray | None:
    """The output layer as one row per class (C, D + 1): the last floating 2-D weight with
    ``num_classes`` rows and more than one column, and its bias (the ``.weight`` → ``.bias``
    entry, when it has C entries); None when there is no such weight (e.g. a convolutional
    head). A (C, 1) tensor is a per-class scale, not the layer: weight norm's g (SHOT's head,
    ``lenet_shot``) is stored after the weight, and read as the output layer it made every
    clean party of ten look renamed (its 10 near-equal magnitudes match in any order)."""
    names = [n for n, v in state.items()
             if v.is_floating_point() and v.dim() == 2 and v.shape[0] == num_classes
             and v.shape[1] > 1]
    if not names:
        return None
    w = state[names[-1]].detach().double()
    b = state.get(names[-1].removesuffix("weight") + "bias")
    if b is not None and b.is_floating_point() and b.shape == (num_classes,):
        w = torch.cat([w, b.detach().double()[:, None]], 1)
    return w.numpy()


def row_renaming(rows: np.ndarray, reference: np.ndarray) -> tuple[int, float]:
    """(how many rows the best one-to-one matching to ``reference``'s rows moves, its summed
    squared distance / the identity's): the Hungarian matching of rows (C, D) to reference
    rows (C, D) by squared Euclidean distance. A renamed output layer moves most rows at a
    fraction of the identity's cost; an honest party moves none or swaps a pair or two of
    rows that were nearly equidistant anyway (cost ratio close to 1)."""
    cost = ((rows[:, None, :] - reference[None, :, :]) ** 2).sum(-1)
    r, c = linear_sum_assignment(cost)
    identity = float(np.trace(cost))
    return int((r != c).sum()), float(cost[r, c].sum() / identity) if identity > 0 else 1.0


def renamed_outputs(states: Sequence[dict[str, torch.Tensor]], num_classes: int,
                    reference: dict[str, torch.Tensor] | None = None
                    ) -> tuple[list[tuple[int, float]], str] | None:
    """(:func:`row_renaming` of every party's output rows, what they were matched to): against
    θ_t's rows (``reference``, the round's starting model every party trained from, when it
    has their layout; "the starting model's") or, without it, against the coordinate-wise
    median of the other parties' rows ("the other parties' median", needs ≥ 3 parties). None
    when the parties' layouts differ or no output layer with C rows is found."""
    if not states or not same_layout(states):
        return None
    rows = [output_rows(s, num_classes) for s in states]
    if any(r is None for r in rows):
        return None
    ref = None
    if reference is not None and same_layout([states[0], reference]):
        ref = output_rows(reference, num_classes)
    if ref is not None:
        return [row_renaming(r, ref) for r in rows], "the starting model's"
    if len(rows) < 3:
        return None
    return [row_renaming(r, np.median(np.stack([o for j, o in enumerate(rows) if j != i]), 0))
            for i, r in enumerate(rows)], "the other parties' median"
