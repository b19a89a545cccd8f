"""The label-free estimate for labels from a model adapted to the target (the adaptive
default's adapt branch): the midpoint of two readings that err in opposite directions there.

The calibrator (mrtf.trust.calibration) was fitted on labels the parties mostly give, and reads
their agreement as evidence; on labels the parties did not give it reads low. The labels' own
mean max probability reads high (the settled model is sure of almost every label). How often
the truth lay between them: docs/benchmarks/calibration.md ("adapted labels").
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from mrtf.trust.calibration import Calibration, own_confidence, plus_minus, temperature_for


def shifted_to_mean(conf: np.ndarray, mean: float) -> np.ndarray:
    """``conf`` moved by one shift of every logit so that its mean is ``mean`` (bisection on
    the shift; the order of the samples is kept)."""
    p = np.clip(np.asarray(conf, np.float64), 1e-7, 1 - 1e-7)
    z = np.log(p) - np.log1p(-p)
    target = float(np.clip(mean, 1e-6, 1 - 1e-6))
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if float((1.0 / (1.0 + np.exp(-(z + mid)))).mean()) < target:
            lo = mid
        else:
            hi = mid
    return (1.0 / (1.0 + np.exp(-(z + (lo + hi) / 2)))).astype(np.float32)


def midpoint_for_adapted(cal: Calibration, probs: np.ndarray,
                         device: str | torch.device = "cpu") -> Calibration:
    """``cal`` for labels from a model adapted to the target: the estimate midway between the
    calibrator's reading (low there: it was fitted on labels the parties mostly give, and
    reads their disagreement with adapted labels as doubt) and the labels' own mean max
    probability (high: the settled model is sure of almost every label). The ± reaches both
    readings plus 2 binomial standard errors (the labels' accuracy on these m samples varies
    around what both read), and is never narrower than the calibrator's own ± (its band at
    its reading: both readings can be off the same way, high where the adapted labels are
    poor, low where the settled model is unsure of right labels). Each sample's confidence
    is shifted by one logit so its mean is the estimate."""
    own = own_confidence(probs)
    est = (cal.estimated_accuracy + own) / 2
    m = len(cal.confidence)
    pm = max(abs(own - cal.estimated_accuracy) / 2 + plus_minus(est, m, 0.0), cal.plus_minus)
    note = (f"the labels come from θ_{{t+1}} adapted to the target: the calibrator (fitted "
            f"on labels the parties give) reads {cal.estimated_accuracy:.3f}, the labels' own "
            f"confidence {own:.3f}; the estimate is midway, the ± spans both")
    return replace(cal, confidence=shifted_to_mean(cal.confidence, est),
                   estimated_accuracy=est, plus_minus=pm,
                   temperature=temperature_for(probs, est, device=device),
                   notes=[*cal.notes, note])
