"""The label-free estimate read midway between two readings that err in opposite directions:
the calibrator's (mrtf.trust.calibration) and the labels' own mean max probability. Used

- for labels from a model adapted to the target (the adaptive default's adapt branch): the
  calibrator was fitted on labels the parties mostly give, and reads their agreement as
  evidence; on labels the parties did not give it reads low, while the settled model is sure
  of almost every label and reads high (docs/benchmarks/calibration.md, "adapted labels");
- for other labels the calibrator reads as mostly right (≥ :data:`MIDPOINT_FROM`): there the
  labels' own confidence is itself a reading (the distilled model is not over-sure of labels
  that are mostly right), and the calibrator reads low where many parties on a new domain
  vote (MNIST → USPS, ten parties: 6-10 points) and a few points high on other sets; the
  midpoint was nearer the truth than either (docs/benchmarks/calibration.md, "Sure labels
  are read midway").

Elsewhere in the calibrator's middle band the labels' own confidence is no reading (a model
distilled from confidently wrong parties is sure of labels that are wrong), but how far it lies
from the calibrator's says how far the calibrator can be off: the ± reaches it
(:func:`reaching_own_confidence`; docs/benchmarks/calibration.md, "The ± reaches the second
reading").
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from mrtf.trust.calibration import (
    Calibration,
    in_lowest_band,
    own_confidence,
    plus_minus,
    temperature_for,
)


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


#: which rule printed an estimate (``Calibration.reading``): the calibrator alone, its lowest
#: band (the ± reaching chance), its middle band (the ± reaching the labels' own confidence),
#: midway for labels read as mostly right or for adapted labels, the adapted vote's student
#: reaching down to the vote; a model's own max probability, as it is or at its temperature
READINGS = ("calibrator", "lowest band", "middle band", "midway (sure labels)",
            "midway (adapted)", "down to the vote", "uncalibrated", "tempered")

#: labels that are not adapted are read midway from this calibrated estimate up: below it the
#: labels' own confidence is no reading (a model distilled from confidently wrong parties is
#: sure of labels that are wrong; docs/benchmarks/calibration.md, "Sure labels are read
#: midway")
MIDPOINT_FROM = 0.80


#: what a midpoint's ± adds for both readings off the same way, beyond half their gap and the
#: sampling error: at most :data:`SHARED_ERROR`, and at most :data:`SHARED_SHARE` of the labels
#: the estimate reads as wrong. Adapted mnist5k → mnistm5k labels (T = 100) read 4.8-4.9
#: points high at 0.87 with the readings 1 point apart: 2.3 points beyond half the gap and
#: the sampling error, a sixth of the 13 % read as wrong; the share keeps sets read at 0.97
#: to a ± of a few points (docs/benchmarks/calibration.md, "The ± reaches the second reading")
SHARED_ERROR = 0.03
SHARED_SHARE = 0.25


def shared_error(estimate: float) -> float:
    """The part of a midpoint's ± for both readings off the same way."""
    return min(SHARED_ERROR, SHARED_SHARE * (1.0 - estimate))


def midpoint_plus_minus(calibrated: float, own: float, m: int, calibrators: float) -> float:
    """The ± of the midpoint of two readings on m samples: half their gap, 2 binomial
    standard errors and :func:`shared_error`; where the calibrator reads most labels as wrong
    (its lowest band) at least its own ± ``calibrators``, which reaches down to chance."""
    est = (calibrated + own) / 2
    pm = abs(own - calibrated) / 2 + plus_minus(est, m, 0.0) + shared_error(est)
    return max(pm, calibrators) if in_lowest_band(calibrated) else pm


def reach_plus_minus(calibrated: float, own: float, calibrators: float) -> float:
    """The calibrator's ± widened to reach the labels' own confidence."""
    return max(calibrators, abs(own - calibrated))


def midpoint(cal: Calibration, probs: np.ndarray, note: str,
             device: str | torch.device = "cpu", *, fit_temperature: bool = True,
             reading: str = "midway (sure labels)") -> Calibration:
    """``cal`` read midway between the calibrator's estimate and the labels' own mean max
    probability, with :func:`midpoint_plus_minus` (the labels' accuracy on these m samples
    varies around what both read, and both can be off the same way). Each sample's
    confidence is shifted by one logit so its mean is the estimate; ``note`` (why both are
    read) goes to the notes with the two readings. ``fit_temperature=False`` keeps ``cal``'s
    temperature, for a reading only its interval is read from (the fit is 50 passes over
    ``probs``). ``reading``: the rule's name (:data:`READINGS`)."""
    own = own_confidence(probs)
    est = (cal.estimated_accuracy + own) / 2
    pm = midpoint_plus_minus(cal.estimated_accuracy, own, len(cal.confidence), cal.plus_minus)
    line = (f"{note}: the calibrator reads {cal.estimated_accuracy:.3f}, the labels' own "
            f"confidence {own:.3f}; the estimate is midway, the ± spans both")
    return replace(cal, confidence=shifted_to_mean(cal.confidence, est),
                   estimated_accuracy=est, plus_minus=pm,
                   temperature=temperature_for(probs, est, device=device)
                   if fit_temperature else cal.temperature,
                   notes=[*cal.notes, line], reading=reading)


def midpoint_for_adapted(cal: Calibration, probs: np.ndarray,
                         device: str | torch.device = "cpu") -> Calibration:
    """:func:`midpoint` for labels from a model adapted to the target: the calibrator reads
    low there (fitted on labels the parties mostly give, it reads their disagreement with
    adapted labels as doubt), the labels' own confidence high (the settled model is sure of
    almost every label); both can be off the same way, high where the adapted labels are
    poor, low where the settled model is unsure of right labels."""
    return midpoint(cal, probs, "the labels come from θ_{t+1} adapted to the target "
                                "(the calibrator was fitted on labels the parties give)", device,
                    reading="midway (adapted)")


def down_to_the_vote(read: Calibration, vote: Calibration, probs: np.ndarray,
                     device: str | torch.device = "cpu") -> Calibration:
    """Labels of the vote's student adapted (the adaptive default's option ``adapt_vote``):
    ``read``, the labels read as voted labels are, with its interval reaching down to the
    lower end of ``vote``'s (the vote's own labels before SHOT, as they are read); the
    estimate is the middle of that interval. SHOT makes the student surer whether or not it
    is right, and where it made it sure of wrong labels, the readings of its labels read
    high; the vote it came from says how poor they can be. Read as adapted labels
    (:func:`midpoint_for_adapted`) they missed more often (docs/benchmarks/label-quality.md,
    "The option adapt_vote")."""
    if vote.estimated_accuracy - vote.plus_minus >= read.estimated_accuracy - read.plus_minus:
        return read  # compared as bounds: (hi − lo) / 2 can exceed the ± by rounding alone
    lo = vote.estimated_accuracy - vote.plus_minus
    hi = read.estimated_accuracy + read.plus_minus
    est, pm = (lo + hi) / 2, (hi - lo) / 2
    line = (f"the vote's student was adapted: its labels read {read.estimated_accuracy:.3f} ± "
            f"{read.plus_minus:.3f}, the vote's before SHOT {vote.estimated_accuracy:.3f} ± "
            f"{vote.plus_minus:.3f}; the ± reaches down to the vote's")
    return replace(read, confidence=shifted_to_mean(read.confidence, est),
                   estimated_accuracy=est, plus_minus=pm,
                   temperature=temperature_for(probs, est, device=device),
                   notes=[*read.notes, line], reading="down to the vote")


def reads_midway(cal: Calibration) -> bool:
    """Whether labels that are not adapted are read midway (:data:`MIDPOINT_FROM`)."""
    return cal.estimated_accuracy >= MIDPOINT_FROM


def midpoint_for_sure_labels(cal: Calibration, probs: np.ndarray,
                             device: str | torch.device = "cpu", *,
                             fit_temperature: bool = True) -> Calibration:
    """:func:`midpoint` for labels that are not adapted and that the calibrator reads as mostly
    right (:func:`reads_midway`): it read 6-10 points low on ten parties voting on a new
    domain, where the labels' own confidence read 0.5-1.5 high."""
    return midpoint(cal, probs, f"the calibrator reads the labels as mostly right (≥ "
                                f"{MIDPOINT_FROM:.2f}), where their own confidence is a reading "
                                "too", device, fit_temperature=fit_temperature)


def reaches_own_confidence(cal: Calibration) -> bool:
    """Whether labels that are not adapted are read by the calibrator alone with a ± reaching
    their own confidence: its middle band, below :data:`MIDPOINT_FROM`."""
    return not (in_lowest_band(cal.estimated_accuracy) or reads_midway(cal))


def reaching_own_confidence(cal: Calibration, probs: np.ndarray) -> Calibration:
    """``cal`` with its ± reaching the labels' own mean max probability (the estimate stays the
    calibrator's): in its middle band the calibrator erred most, either way, where the two
    readings lay far apart (scikit-digits parties on MNIST read high, MNIST parties on MNIST-M
    low; docs/benchmarks/calibration.md). Said in the notes when it widens."""
    own = own_confidence(probs)
    pm = reach_plus_minus(cal.estimated_accuracy, own, cal.plus_minus)
    if pm <= cal.plus_minus:
        return replace(cal, reading="middle band")
    line = (f"the calibrator reads {cal.estimated_accuracy:.3f}, the labels' own confidence "
            f"{own:.3f}; readings this far apart say the calibrator can be off as far: the ± "
            "reaches the other")
    return replace(cal, plus_minus=pm, notes=[*cal.notes, line], reading="middle band")


def reaching_the_even_reading(cal: Calibration, even: float) -> Calibration:
    """``cal``, read with the class frequencies the user gave, with its ± reaching ``even``,
    the estimate read as if the classes were balanced (the estimate stays). The calibrator
    was fitted on balanced targets, where the two readings are one; on a skewed target the
    given frequencies lift its reading where the labels follow them, and how far that holds
    rests on few sets (it read high with a ± too narrow on some:
    docs/benchmarks/class-frequencies.md). Said in the notes when it widens."""
    pm = max(cal.plus_minus, abs(even - cal.estimated_accuracy))
    if pm <= cal.plus_minus:
        return cal
    line = (f"read as if the classes were balanced, the estimate would be {even:.3f}: the ± "
            "reaches it")
    return replace(cal, plus_minus=pm, notes=[*cal.notes, line])
