"""Accuracy on the server's target set of every model or prediction a strategy reports, scored
as the in-process engine scores them (the target's ``y`` is read for scoring only)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from mrtf.federated.methods import Aggregated

#: the columns a strategy may report (``mrtf.federated.methods.SCORES``)
COLUMNS = ("averaged", "ensemble", "refined", "aca", "oca")


@torch.inference_mode()
def model_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                   batch_size: int = 1024) -> float:
    """Per-sample accuracy, in the in-process engine's batches (same floats, same argmax), on
    the device the model is on (the server builds models on CUDA when present)."""
    model = model.eval()
    dev = next(model.parameters()).device
    right = 0
    for start in range(0, len(x), batch_size):
        pred = model(x[start:start + batch_size].to(dev)).argmax(1).cpu()
        right += int((pred == y[start:start + batch_size]).sum())
    return right / max(1, len(x))


def score(agg: Aggregated, build: Callable[[dict], nn.Module], x: torch.Tensor,
          y: np.ndarray) -> dict[str, float | None]:
    """Every column's accuracy (None where the strategy has no such model) and ``accuracy``,
    the method's own (``agg.primary``)."""
    scores: dict[str, float | None] = dict.fromkeys(COLUMNS)
    yt = torch.from_numpy(y)
    for col, state in agg.states.items():
        if col not in agg.probs:
            scores[col] = model_accuracy(build(state), x, yt)
    for col, probs in agg.probs.items():
        scores[col] = float((np.asarray(probs).argmax(1) == y).mean())
    return {"accuracy": scores.get(agg.primary), **scores}
