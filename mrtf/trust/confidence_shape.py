"""Each sample's printed confidence: the calibrator's order, the tempered model's values.

The calibrator (mrtf.trust.calibration) reads which labels are likelier right than others
from label-free signals (the parties' probability of each label, the target neighbours that
share it), and its mean is the estimate printed. The refined model's own max probability at
the temperature T fitted to that estimate (what ``mrtf label`` writes) has the same mean, and
its values are spread as right and wrong labels are: many near 1, a tail of doubtful ones,
where the calibrator's values bunch together. So each sample keeps its rank under the
calibrator and takes the tempered value of that rank: the order, and so which samples
``--coverage`` leaves unlabeled, is unchanged, and on every benchmark the median ECE fell
(docs/benchmarks/calibration.md, "The calibrator orders, the tempered model says how sure").
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mrtf.trust.calibration import Calibration, apply_temperature
from mrtf.trust.midpoint_estimate import shifted_to_mean


def in_order_of(order: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` rearranged so that their ranks are those of ``order`` (the i-th smallest
    value goes to the sample with the i-th smallest ``order``; ties in ``order`` keep the
    samples' order)."""
    order, values = np.asarray(order), np.asarray(values)
    if order.shape != values.shape or order.ndim != 1:
        raise ValueError(f"order {order.shape} and values {values.shape} must be (M,) alike")
    out = np.empty_like(values)
    out[np.argsort(order, kind="stable")] = np.sort(values)
    return out


def tempered_in_calibrators_order(cal: Calibration, probs: np.ndarray) -> Calibration:
    """``cal`` whose per-sample confidence takes the values of ``probs``' max probability at
    ``cal.temperature`` in the order of ``cal.confidence``, moved by one logit shift to the
    estimate exactly (the temperature's fit leaves it within about 10⁻³)."""
    values = apply_temperature(probs, cal.temperature)
    conf = shifted_to_mean(in_order_of(cal.confidence, values), cal.estimated_accuracy)
    return replace(cal, confidence=conf)
