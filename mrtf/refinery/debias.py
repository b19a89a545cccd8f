"""A source's class bias divided out (the uniform class prior of the adaptive consensus), and
the label diversity that sets how strongly (adaptive.py has the measurements)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: strength of the class-bias correction s = min(1, h / DEBIAS_SCALE), h = the sources' mean
#: normalised entropy of their predicted-label histogram (see ``debias``; class_prior uniform)
DEBIAS_SCALE = 0.2


def label_diversity(probs: np.ndarray, block: int = 65_536) -> float:
    """Normalised entropy (0..1) of the histogram of a source's predicted labels (M, C):
    0 when it names one class for every sample, 1 when it names every class equally often.
    Read ``block`` rows at a time (no (M,) label array for a spilled or memory-mapped
    ``probs``)."""
    return histogram_diversity(label_counts(probs, block))


def label_counts(probs: np.ndarray, block: int = 65_536) -> np.ndarray:
    """(C,) int64: how many of the M rows of ``probs`` (M, C) name each class, read ``block``
    rows at a time."""
    m, c = probs.shape
    counts = np.zeros(c, dtype=np.int64)
    for s in range(0, m, block):
        counts += np.bincount(np.asarray(probs[s:s + block]).argmax(1), minlength=c)
    return counts


def histogram_diversity(counts: np.ndarray) -> float:
    """label_diversity from the counts (C,) of each predicted label (block-wise callers)."""
    c = len(counts)
    hist = np.asarray(counts, dtype=np.float64) / max(1.0, float(np.sum(counts)))
    hist = hist[hist > 0]
    # max: one class gives -0.0, printed "-0.00"
    return max(0.0, float(-(hist * np.log(hist)).sum() / np.log(c))) if c > 1 else 0.0


def debias(probs: np.ndarray, strength: float, mean: np.ndarray | None = None,
           prior: np.ndarray | None = None) -> np.ndarray:
    """A source's class bias divided out: q'(c|x) ∝ q(c|x) / (mean_x q(c|x))^s, (M, C) float32;
    with the target's class shares ``prior`` π (given by the user) q'(c|x) ∝ q(c|x) · (π_c /
    mean_x q(c|x))^s, Saerens et al.'s correction toward π instead of an even prior.

    A model moved to another domain (digits → MNIST) or trained on few classes names a few
    classes far more often than the target holds them, and its Eq. 6 probabilities still rank
    the samples within each class. Dividing by its mean prediction (the prior correction of
    Saerens et al. 2002 toward a uniform class prior, what MrTF's per-class prototypes and
    SHOT's diversity term assume too) lets its second choices count. A source that names one
    class everywhere has no ranking left to expose, so the strength follows the sources'
    label diversity (``debias_strength``).

    Measured (bench/label_quality.py cells, targets before distillation, 3 seeds): +2.6 points
    on the balanced grid (digits→mnist5k +7.1, label:2 one-shot +4.9), but -5.4 on the same
    targets subsampled to skewed classes (class c kept with probability 0.6^c; 50 rounds
    -7.0). The models' outputs cannot tell a domain shift from a skewed target, so it is
    applied when the user states it (``class_prior="uniform"``) or when the target's own
    neighbourhoods prefer its labels (``class_prior="auto"``, the default: prior_choice.py).

    mean: the source's mean prediction (C,) over all M samples, for a caller that has only
    a block of ``probs`` (the spilled storage); summed in float64 either way, so a block-wise
    sum gives the same float32 result."""
    if strength <= 0:
        return probs
    if mean is None:
        mean = probs.mean(0, dtype=np.float64)
    r = probs / np.maximum(toward(mean, prior), 1e-8) ** strength
    return (r / r.sum(1, keepdims=True)).astype(np.float32)


def toward(mean: np.ndarray, prior: np.ndarray | None) -> np.ndarray:
    """The divisor of :func:`debias` (float64): a source's mean prediction, over the class
    shares ``prior`` where given (dividing by mean / π multiplies by π)."""
    mean = np.asarray(mean, np.float64)
    return mean if prior is None else mean / np.asarray(prior, np.float64)


def debias_strength(views: Sequence[np.ndarray], scale: float = DEBIAS_SCALE) -> float:
    """s = min(1, mean label diversity / scale): full correction once the sources name
    several classes (h ≥ 0.2), none when every source names one class for everything."""
    h = float(np.mean([label_diversity(v) for v in views])) if len(views) else 0.0
    return float(min(1.0, h / scale))


def strength_of_counts(counts: np.ndarray, live: Sequence[int]) -> float:
    """:func:`debias_strength` of the ``live`` sources from their label counts (S, C): the
    same number, for storage that counts labels block by block."""
    if not len(live):
        return 0.0
    h = float(np.mean([histogram_diversity(counts[i]) for i in live]))
    return float(min(1.0, h / DEBIAS_SCALE))
