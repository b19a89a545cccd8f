"""Scoring labels against ground truth: accuracy, per-class accuracy, confusion matrix."""

from __future__ import annotations

from typing import Any

import numpy as np

from mrtf.errors import InputError

MAX_SCORE_CLASSES = 10_000


def score_labels(labels: np.ndarray, truth: np.ndarray, num_classes: int | None = None
                 ) -> dict[str, Any]:
    """Per-sample accuracy, per-class accuracy (recall; None for absent classes) and the
    confusion matrix (rows = truth, columns = predicted) of ``labels`` (M,) vs ``truth`` (M,)."""
    labels, truth = np.asarray(labels).reshape(-1), np.asarray(truth).reshape(-1)
    if len(labels) != len(truth):
        raise InputError(f"{len(labels)} labels but {len(truth)} true labels")
    if len(labels) == 0:
        raise InputError("nothing to score (0 labels)")
    for name, arr in (("labels", labels), ("true labels", truth)):
        if arr.dtype.kind not in "iu":
            raise InputError(f"{name} must be integers, got {arr.dtype}")
        if int(arr.min()) < 0:  # a negative index would silently count as class C - k
            raise InputError(f"{name} hold {int(arr.min())}; classes are 0, 1, ...")
    c = num_classes or int(max(labels.max(), truth.max())) + 1
    if c > MAX_SCORE_CLASSES:  # the confusion matrix is c × c
        raise InputError(f"{c:,} classes: too many to score (at most {MAX_SCORE_CLASSES:,})")
    for name, arr in (("labels", labels), ("true labels", truth)):
        if int(arr.max()) >= c:
            raise InputError(f"{name} hold class {int(arr.max())}, but there are only {c} "
                             "classes")
    confusion = np.zeros((c, c), dtype=np.int64)
    np.add.at(confusion, (truth, labels), 1)
    support = confusion.sum(1)
    per_class = [float(confusion[i, i] / support[i]) if support[i] else None for i in range(c)]
    return {"accuracy": float((labels == truth).mean()), "n": int(len(labels)),
            "per_class": per_class, "support": support.tolist(),
            "confusion": confusion.tolist()}
