"""Parameter averaging (FedAvg aggregation)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def average_states(states: Sequence[dict[str, torch.Tensor]],
                   weights: Sequence[float] | None = None) -> dict[str, torch.Tensor]:
    """Weighted average of state dicts (uniform when ``weights`` is None).

    Float tensors (BN running statistics included) are averaged; integer buffers such as
    ``num_batches_tracked`` take the maximum.
    """
    if not states:
        raise ValueError("nothing to average")
    keys = list(states[0])
    for s in states[1:]:
        if list(s) != keys:
            raise ValueError("state dicts have different keys (different architectures?)")
    w = torch.tensor([1.0] * len(states) if weights is None else list(weights),
                     dtype=torch.float64)
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError("averaging weights must be non-negative with a positive sum")
    w = w / w.sum()
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        tensors = [s[key].detach().cpu() for s in states]
        if tensors[0].is_floating_point():
            stacked = torch.stack([t.double() for t in tensors])
            avg = (stacked * w.view(-1, *([1] * tensors[0].dim()))).sum(0)
            out[key] = avg.to(tensors[0].dtype)
        else:
            out[key] = torch.stack(tensors).max(0).values
    return out
