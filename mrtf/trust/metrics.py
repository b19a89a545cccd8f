"""Calibration metrics (they read y: for scoring and benchmarks only)."""

from __future__ import annotations

import numpy as np

BINS = 15


def reliability_bins(confidence: np.ndarray, correct: np.ndarray, bins: int = BINS
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(bin centers, accuracy, mean confidence, count) over ``bins`` equal-width bins of
    [0, 1] (the last one closed)."""
    conf = np.clip(np.asarray(confidence, dtype=np.float64), 0.0, 1.0)
    ok = np.asarray(correct, dtype=np.float64)
    idx = np.minimum((conf * bins).astype(int), bins - 1)
    counts = np.bincount(idx, minlength=bins).astype(np.float64)
    safe = np.maximum(counts, 1)
    acc = np.bincount(idx, weights=ok, minlength=bins) / safe
    mean_conf = np.bincount(idx, weights=conf, minlength=bins) / safe
    centers = (np.arange(bins) + 0.5) / bins
    return centers, acc, mean_conf, counts


def ece(confidence: np.ndarray, correct: np.ndarray, bins: int = BINS) -> float:
    """Expected calibration error: Σ_b (n_b / n) |acc_b − conf_b| (Guo et al. 2017)."""
    _, acc, mean_conf, counts = reliability_bins(confidence, correct, bins)
    n = counts.sum()
    return float((counts / max(n, 1) * np.abs(acc - mean_conf)).sum())


def ece_floor(confidence: np.ndarray, bins: int = BINS) -> float:
    """The ECE a *perfectly calibrated* confidence would show on these samples from sampling
    alone: its expectation when each sample is right with probability equal to its confidence.

    Per bin, the accuracy of n_b such samples misses their mean confidence by a sum of
    independent Bernoulli deviations of variance V_b = Σ p(1 − p); by the normal
    approximation E|·| = √(2/π) √V_b / n_b, so the floor is √(2/π) Σ_b √V_b / n. At 1,000
    samples it is typically 0.01-0.03: an ECE below it cannot be told apart from perfect.
    """
    conf = np.clip(np.asarray(confidence, dtype=np.float64), 0.0, 1.0)
    idx = np.minimum((conf * bins).astype(int), bins - 1)
    var = np.bincount(idx, weights=conf * (1 - conf), minlength=bins)
    return float(np.sqrt(2 / np.pi) * np.sqrt(var).sum() / max(len(conf), 1))
