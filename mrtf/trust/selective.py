"""Selective labeling: leave the least confident samples unlabeled (``--min-confidence``,
``--coverage``). An abstained sample keeps its probabilities in the labels file, gets label -1
and ``abstained = 1``; the kept labels are the ones the (calibrated) confidence ranks highest,
so their accuracy is what the risk-coverage curve (``mrtf score --plot``) shows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mrtf.errors import InputError


@dataclass
class Selection:
    """abstained (M,) bool: True where no label is given. threshold: the smallest kept
    confidence (None when every sample is kept or none). coverage: fraction kept. rule: the
    option that chose it, in words."""

    abstained: np.ndarray
    threshold: float | None
    coverage: float
    rule: str

    def to_dict(self) -> dict:
        return {"threshold": self.threshold, "coverage": self.coverage, "rule": self.rule,
                "abstained": int(self.abstained.sum())}


def check_selection(min_confidence: float | None, coverage: float | None) -> None:
    """One line (InputError) for a value that selects nothing meaningful."""
    if min_confidence is not None and coverage is not None:
        raise InputError("give --min-confidence or --coverage, not both")
    if min_confidence is not None and not 0.0 <= min_confidence <= 1.0:
        raise InputError(f"--min-confidence must be in [0, 1], got {min_confidence}")
    if coverage is not None and not 0.0 < coverage <= 1.0:
        raise InputError(f"--coverage must be in (0, 1], got {coverage}")


def select(confidence: np.ndarray, min_confidence: float | None = None,
           coverage: float | None = None) -> Selection | None:
    """Which samples to abstain on: confidence below ``min_confidence``, or all but the
    ``coverage`` fraction with the highest confidence (ties: the earlier row is kept, so the
    choice is deterministic). None when neither is given."""
    check_selection(min_confidence, coverage)
    conf = np.asarray(confidence, dtype=np.float64)
    m = len(conf)
    if min_confidence is not None:
        abst = conf < min_confidence
        rule = f"confidence < {min_confidence:g}"
    elif coverage is not None:
        keep = int(np.floor(coverage * m + 1e-9))
        order = np.lexsort((np.arange(m), -conf))  # highest confidence first, then row
        abst = np.ones(m, dtype=bool)
        abst[order[:keep]] = False
        rule = f"coverage {coverage:g} (the {keep} most confident of {m})"
    else:
        return None
    kept = conf[~abst]
    return Selection(abst, float(kept.min()) if len(kept) and abst.any() else None,
                     float((~abst).mean()) if m else 0.0, rule)


def risk_coverage(confidence: np.ndarray, correct: np.ndarray, points: int = 100
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(coverage, accuracy of the kept samples) when keeping the most confident fraction, at
    ``points`` coverages from 1/points to 1 (for scoring, with y)."""
    conf = np.asarray(confidence, dtype=np.float64)
    order = np.lexsort((np.arange(len(conf)), -conf))
    hits = np.cumsum(np.asarray(correct, dtype=np.float64)[order])
    cov = np.linspace(1.0 / points, 1.0, points)
    n = np.maximum(1, np.floor(cov * len(conf) + 1e-9).astype(int))
    return cov, hits[n - 1] / n
