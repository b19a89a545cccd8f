"""The target's class frequencies, when the user knows them (``refine --class-frequencies``).

One of the calibrator's signals (mrtf.trust.calibration, FEATURES[5]) is how far the labels
spread over the classes: labels of confidently wrong parties pile onto a few. Measured
against an even spread, it reads a target whose classes really are skewed as doubt (USPS's
test set: MNIST → USPS reads low). Nothing label-free found the skew
(docs/benchmarks/calibration.md, "A class prior from the target", with the numbers), so a
user who knows the frequencies can give them, and the spread
is then measured against them: 1 − KL(h ‖ π) / ln C for the labels' histogram h and the
given π, which is the entropy of h over ln C when π is even (what the calibrator was fitted
on: balanced targets). Frequencies that are wrong move the estimate the other way.

The refinery reads the same frequencies wherever else the default assumes an even spread
(RefineConfig.class_shares): the consensus divides each model's class bias out toward them
(refinery.debias), the diversity terms of SHOT, NRC and DECISION aim at them
(refinery.prior_diversity: refinery.shot, refinery.nrc, refinery.decision), and the adapted
labels' spread is checked against them (refinery.branch_choice). The methods whose labels
have no class prior (refinery.registry.Method.takes_class_frequencies) leave them to the
estimate, and the run says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mrtf.errors import InputError

#: where a given frequency of 0 is raised to before normalising: a label in a class said
#: never to occur reads as strong doubt, not as an infinite divergence
FLOOR = 1e-6


def parse_class_frequencies(text: str) -> tuple[float, ...]:
    """``"0.16,0.14,..."`` (any scale: shares or counts) as a tuple; InputError if it is not
    a comma-separated list of at least two non-negative numbers with a positive sum."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise InputError(f"--class-frequencies must be comma-separated numbers, one per "
                         f"class, got {text[:80]!r}") from None
    check_class_frequencies(values)
    return values


def check_class_frequencies(values: Sequence[float], num_classes: int | None = None) -> None:
    """InputError unless ``values`` are ≥ 2 finite non-negative numbers with a positive sum,
    one per class when ``num_classes`` is given."""
    if len(values) < 2:
        raise InputError(f"class frequencies need one number per class (at least 2), got "
                         f"{len(values)}")
    if not all(math.isfinite(v) and v >= 0 for v in values) or sum(values) <= 0:
        raise InputError("class frequencies must be finite, non-negative and not all 0")
    if num_classes is not None and len(values) != num_classes:
        raise InputError(f"{len(values)} class frequencies were given but the received "
                         f"models have {num_classes} classes")


def normalised(values: Sequence[float]) -> np.ndarray:
    """The frequencies as a distribution (float64, each ≥ :data:`FLOOR` before the sum)."""
    p = np.maximum(np.asarray(values, dtype=np.float64) / float(sum(values)), FLOOR)
    return p / p.sum()


def spread_against(hist: np.ndarray, prior: np.ndarray | None) -> float:
    """How far the labels' class histogram ``hist`` spreads, as a share of ln C: its entropy
    over ln C when ``prior`` is None (an even spread assumed), else 1 − KL(hist ‖ prior) /
    ln C (1 when the labels spread as the prior does; may fall below 0)."""
    c = len(hist)
    nz = hist > 0
    if prior is None:
        return float(-(hist[nz] * np.log(hist[nz])).sum() / math.log(c))
    return float(1.0 - (hist[nz] * np.log(hist[nz] / prior[nz])).sum() / math.log(c))
