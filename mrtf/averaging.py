"""Parameter averaging (FedAvg's aggregation). The refinery, data-free fusion and the federation
all use it, so it sits below the three of them: none imports another to get it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def _common_keys(states: Sequence[dict[str, torch.Tensor]]) -> list[str]:
    """The state dicts' keys, which must be the same in every one (one architecture)."""
    if not states:
        raise ValueError("nothing to average")
    keys = list(states[0])
    for s in states[1:]:
        if list(s) != keys:
            raise ValueError("state dicts have different keys (different architectures?)")
    return keys


def average_states(states: Sequence[dict[str, torch.Tensor]],
                   weights: Sequence[float] | None = None) -> dict[str, torch.Tensor]:
    """Weighted average of state dicts (uniform when ``weights`` is None).

    Float tensors (BN running statistics included) are averaged; integer buffers such as
    ``num_batches_tracked`` take the maximum.
    """
    keys = _common_keys(states)
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


AGGREGATES = ("mean", "median", "trimmed:β")


def parse_aggregate(spec: str) -> tuple[str, float]:
    """``mean`` | ``median`` | ``trimmed:β`` (0 ≤ β < 0.5) → (kind, β); ValueError otherwise."""
    spec = str(spec).strip()
    if spec in ("mean", "median"):
        return spec, 0.0
    if spec.startswith("trimmed:"):
        try:
            beta = float(spec.split(":", 1)[1])
        except ValueError:
            beta = float("nan")
        if 0.0 <= beta < 0.5:
            return "trimmed", beta
    raise ValueError(f"aggregate must be mean, median or trimmed:β with 0 <= β < 0.5, "
                     f"got {spec!r}")


def aggregate_states(states: Sequence[dict[str, torch.Tensor]],
                     weights: Sequence[float] | None = None,
                     aggregate: str = "mean") -> dict[str, torch.Tensor]:
    """Robust parameter aggregation (issue 13): ``mean`` (weighted, :func:`average_states`),
    ``median`` (coordinate-wise median) or ``trimmed:β`` (coordinate-wise mean after dropping
    the ⌊β·K⌋ largest and smallest values of every coordinate; Yin et al. 2018). The median and
    the trimmed mean ignore ``weights``: a weight is a claim, and the point of a robust
    aggregate is that no single party's values or claims move it far. Integer buffers take the
    maximum, as in :func:`average_states`."""
    kind, beta = parse_aggregate(aggregate)
    if kind == "mean":
        return average_states(states, weights)
    keys = _common_keys(states)
    k = len(states)
    cut = int(math.floor(beta * k)) if kind == "trimmed" else 0
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        tensors = [s[key].detach().cpu() for s in states]
        if not tensors[0].is_floating_point():
            out[key] = torch.stack(tensors).max(0).values
            continue
        stacked = torch.stack([t.double() for t in tensors])
        if kind == "median":
            # the mean of the two middle values for even K (torch.median takes the lower one)
            srt = stacked.sort(0).values
            val = (srt[(k - 1) // 2] + srt[k // 2]) / 2
        else:
            val = stacked.sort(0).values[cut:k - cut].mean(0)
        out[key] = val.to(tensors[0].dtype)
    return out


def average_received(models: Sequence, by_samples: bool = True,
                     weights: Sequence[float] | None = None, aggregate: str = "mean"):
    """θ_{t+1}: the parameter average of received local models (``ReceivedModel`` list).

    Weighted by ``n_samples`` when every model reports it and ``by_samples`` is set, else
    uniform (the MrTF paper's 1/|S_t|). ``weights``: given weights instead (e.g. the claim-checked,
    verdict-scaled weights of :mod:`mrtf.trust`). ``aggregate``: see :func:`aggregate_states`.
    All models must share one architecture. Returns ``(model in eval mode, weights used)``.
    """
    from mrtf.errors import InputError
    from mrtf.models import build_model

    if not models:
        raise InputError("no local models to average")
    first = models[0].meta
    for m in models[1:]:
        if (m.meta.arch, m.meta.arch_kwargs) != (first.arch, first.arch_kwargs):
            raise InputError("received models differ in architecture; there is no parameter "
                             "average (give a student: --student-arch ARCH or --student FILE)")
    counts = [m.meta.n_samples for m in models]
    given = weights
    weights = [1.0] * len(models) if given is None else [float(w) for w in given]
    if given is None and by_samples and all(isinstance(c, int) and c > 0 for c in counts):
        try:  # counts come from untrusted files: bounded on load, guarded here again
            weights = [float(c) for c in counts]
        except OverflowError:
            raise InputError("a party's mrtf.n_samples is too large to weight by") from None
    total = math.fsum(weights)
    if not math.isfinite(total) or total <= 0:
        raise InputError("the parties' mrtf.n_samples give no usable averaging weights")
    weights = [w / total for w in weights]
    model = build_model(first.arch, first.num_classes, **first.arch_kwargs)
    model.load_state_dict(aggregate_states([m.state_dict for m in models], weights, aggregate))
    return model.eval(), weights
