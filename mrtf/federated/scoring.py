"""Scores of a round: accuracy on the server's target set of every model and prediction a
strategy reports, and FedKF's AMP / FM / WLP on the clients' local test parts."""

from __future__ import annotations

import numpy as np
import torch

from mrtf.federated.fairness import LOCAL_METRICS, client_accuracies, fairness_metrics
from mrtf.federated.federation import Federation
from mrtf.federated.local import accuracy
from mrtf.federated.strategies.base import SCORES, Aggregated, ServerContext


def score(ctx: ServerContext, agg: Aggregated, fed: Federation, dev: torch.device
          ) -> dict[str, float | None]:
    """Accuracy on the target of every model and prediction the strategy reports."""
    scores: dict[str, float | None] = dict.fromkeys(SCORES)
    local_tests = fed.test_parts is not None
    # a model is built only where it is used: target accuracy not given by predictions,
    # or the clients' local test parts
    models = {col: ctx.build(st) for col, st in agg.states.items()
              if col not in agg.probs or local_tests}
    for col, model in models.items():
        if col not in agg.probs:
            scores[col] = accuracy(model, fed.target_x, fed.target_y, device=dev)
    y_np = fed.target_y.numpy()
    for col, probs in agg.probs.items():
        scores[col] = float((np.asarray(probs).argmax(1) == y_np).mean())
    if local_tests:
        scores.update(local_scores(models, agg.primary, fed, dev))
    return scores


def local_scores(models: dict, primary: str, fed: Federation, dev: torch.device
                 ) -> dict[str, float | None]:
    """FedKF's AMP / FM / WLP of every model on the clients' local test parts: ``amp`` etc.
    for the method's own model, ``amp_<column>`` for each model scored (e.g. OCA and ACA)."""
    sizes = np.array([len(a) + len(b) for a, b in zip(fed.parts, fed.test_parts)])
    out: dict[str, float | None] = {}
    for col, model in models.items():
        accs = client_accuracies(model, fed.x, fed.y, fed.test_parts, dev)
        for name, value in fairness_metrics(accs, sizes).items():
            out[f"{name}_{col}"] = value
    for name in LOCAL_METRICS:
        out[name] = out.get(f"{name}_{primary}")
    return out
