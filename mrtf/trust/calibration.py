"""Calibrated confidence and a label-free accuracy estimate for the refinery's labels.

The refined model's max probability is no probability of being right: distillation to a
consensus that is ≥ 0.95 sure makes it ≥ 0.9 sure on cross-domain targets where it is right
0.3-0.5 of the time (docs/results.md). The confidence refine reads is instead

    conf(x) = σ(w · φ(x) + b),

a logistic model of "the label of x is right" on **label-free signals** φ(x): the refined
model's and the parties' mean probability of the label, the share of the sample's nearest target
samples (in the target's own input space, mrtf.trust.neighbours) that carry the same label —
labels that are right follow the target's natural clusters, wrong ones cut across them — and
three cell-level signals: the parties' mean confidence on the target, how often two parties
agree, and how evenly the labels spread over the classes (confidently wrong parties pile their
labels onto a few classes; this assumes balanced classes and reads skewed ones as doubt, unless
the user gives the target's class frequencies: mrtf.trust.class_frequencies). w and b
(:data:`COEF`) were fitted once, with labels, on the 24 received sets of the label-quality grid
(bench/calibration.py) and are fixed: at run time nothing reads ``y``. The estimated accuracy of
the labels is the mean calibrated confidence; its ± is the larger of the sampling error and what
9 in 10 out-of-sample estimates at that level held (:data:`ERROR_BANDS`; in the lowest band down
to chance); without neighbourhoods, the earlier 12-signal model (:data:`FALLBACK_COEF`).

For ``mrtf label`` (one model, no parties) the refined model carries a temperature T (its
bundle's ``mrtf.calibration``): its max probability at T has the calibrated confidence's
mean. Refine writes per sample that tempered probability in the order of conf(x)
(mrtf.trust.confidence_shape).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from mrtf.device import off_cpu
from mrtf.trust.class_frequencies import spread_against
from mrtf.trust.neighbours import label_consistency
from mrtf.trust.signals_torch import tallies_torch

#: feature names, in the order of COEF (per sample, then per cell); logit(p) = log p/(1-p)
FEATURES = ("logit refined p(label)", "logit parties' mean p(label)",
            "share of the target neighbours with the same label",
            "cell: logit parties' mean confidence", "cell: pairwise party agreement",
            "cell: logit entropy of the labels' histogram / log C")
#: fitted on the 24 received sets of the label-quality grid (adaptive, seed 0, 1,000 samples
#: each, refined by the default with its vote-or-adapt step, neighbour vote and input jitter;
#: ``python bench/calibration.py --fit``, L2 C = 0.05; refitted 2026-11-23 for the input
#: jitter); the features by forward selection on the leave-one-scenario-out error
#: (bench/calibration_select.py); the last entry is b
COEF: tuple[float, ...] = (0.4135, 0.4292, 0.4696, 0.3495, -0.6232, 0.4639, -2.1938)
#: the ± of a confidence the calibrator did not make (``uncalibrated``): the calibrated
#: estimate's RMS error on 27 fresh cells (9 scenarios never used in the fit;
#: bench/calibration_fresh.py, docs/results.md); a model's own max probability is usually worse
GRID_ERROR = 0.083
#: the honest ± of the calibrated estimate, by its level: (lowest estimate of the band, the
#: 90th percentile of |error| there) over 53 out-of-sample estimates (the 24 grid cells each
#: from a fit without its scenario, the 2 T = 200 cells, 27 fresh cells of 9 unseen
#: scenarios; ``python bench/calibration.py --bands``), so that about 9 in 10 held; the
#: error per band is in docs/benchmarks/calibration.md ("The ± by the estimate's level")
ERROR_BANDS: tuple[tuple[float, float], ...] = ((0.85, 0.027), (0.40, 0.126), (0.0, 0.155))

#: the earlier model, kept for Signals without the target's neighbourhoods (a caller that
#: builds Signals itself); same grid, L2 C = 0.05
FALLBACK_FEATURES = ("logit refined p(label)", "logit consensus p(label)",
                     "vote share of label", "logit parties' mean p(label)",
                     "ensemble names label", "logit θ_{t+1} p(label)", "θ_{t+1} names label",
                     "cell: logit parties' mean confidence", "cell: pairwise party agreement",
                     "cell: ensemble agrees with labels", "cell: θ_{t+1} agrees with labels",
                     "cell: logit refined mean confidence")
FALLBACK_COEF: tuple[float, ...] = (0.2685, -0.0015, -0.0409, 0.2940, 0.6362, 0.1487, -0.3274,
                                    0.4668, -1.5001, 0.8170, -1.1914, 0.6735, -3.1317)
#: its leave-one-scenario-out RMS error on the grid (max 0.143)
FALLBACK_GRID_ERROR = 0.077


def _logit(p: np.ndarray | float) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


@dataclass
class Signals:
    """Label-free evidence about every class of every sample, kept from the teachers' pass
    (so the (K, M, C) logits can be freed before distillation).

    votes (M, C): share of the local models whose argmax is c. mean_prob (M, C): their mean
    softmax. ensemble (M,): argmax of mean_prob. averaged (M, C): θ_{t+1}'s softmax (or the
    student's). consensus (M, C): the distillation targets. local_confidence: the local
    models' mean max softmax on the target set. pairwise_agreement: how often two local
    models give the same label (mean over pairs). neighbours (M, k): each sample's nearest
    target samples in the target's own input space (mrtf.trust.neighbours), attached by the
    refinery after the teachers' pass; None selects the fallback model. class_prior: the
    target's class frequencies (C,) if given (class_frequencies.py)."""

    votes: np.ndarray
    mean_prob: np.ndarray
    averaged: np.ndarray
    consensus: np.ndarray
    local_confidence: float
    pairwise_agreement: float
    neighbours: np.ndarray | None = None
    class_prior: np.ndarray | None = None

    @classmethod
    def from_logits(cls, local_logits: np.ndarray, averaged: np.ndarray, consensus: np.ndarray,
                    block: int | None = None, models: int | None = None,
                    device: torch.device | None = None) -> Signals:
        """local_logits (K, M, C) of the local models, or anything indexed ``a[:k, s:e]`` that
        returns such a block (the streaming path's spill, read ``block`` rows at a time, whose
        first ``models`` teachers are the local models); averaged, consensus (M, C).
        ``device`` other than the CPU: the same tallies in torch there (signals_torch.py)."""
        k, m, _ = local_logits.shape
        k = k if models is None else models
        block = m if block is None else block
        dev = off_cpu(device)
        if dev is None:
            votes, mean, conf_sum, same = _tallies(local_logits, k, block)
        else:
            votes, mean, conf_sum, same = tallies_torch(local_logits, k, block, dev)
        conf = float(np.sum(conf_sum / m) / k)
        pairs = [same[i, j] / m for i in range(k) for j in range(i + 1, k)]
        return cls(votes, mean, np.asarray(averaged, np.float32),
                   np.asarray(consensus, np.float32), conf,
                   float(np.mean(pairs)) if pairs else 1.0)


def _tallies(local_logits, k: int, block: int) -> tuple[np.ndarray, ...]:
    """The first k models' votes (M, C) and mean softmax (M, C) float32, each one's summed max
    softmax (k,) and the pairs' agreeing-label counts (k, k), ``block`` rows at a time."""
    m, c = local_logits.shape[1], local_logits.shape[2]
    votes = np.zeros((m, c), dtype=np.float32)
    mean = np.zeros((m, c), dtype=np.float32)  # summed in float64 block by block
    conf_sum = np.zeros(k)
    same = np.zeros((k, k))
    for s in range(0, m, block):
        rows = local_logits[:k, s:s + block]
        n = rows.shape[1]
        picks = []
        acc = np.zeros((n, c))
        for i in range(k):  # one model at a time: no (K, M, C) float64 temporary
            p = _softmax(rows[i])
            pick = p.argmax(1)
            votes[s + np.arange(n), pick] += 1.0 / k
            acc += p / k
            conf_sum[i] += float(p.max(1).sum())
            picks.append(pick)
        mean[s:s + n] = acc
        for i in range(k):
            for j in range(i + 1, k):
                same[i, j] += float((picks[i] == picks[j]).sum())
    return votes, mean, conf_sum, same


def features(probs: np.ndarray, s: Signals) -> np.ndarray:
    """φ(x) (M, len(FEATURES)) for the labels argmax(probs); needs ``s.neighbours``."""
    if s.neighbours is None:
        raise ValueError("Signals.neighbours is None: use fallback_features")
    probs = np.asarray(probs)
    m = len(probs)
    labels = probs.argmax(1)
    per = _per_sample(probs, labels, s, 0, m)
    cell = _cell(labels, probs.shape[1], s)
    return np.concatenate([per, np.broadcast_to(cell, (m, len(cell)))], 1)


def _per_sample(probs: np.ndarray, labels: np.ndarray, s: Signals, a: int, b: int
                ) -> np.ndarray:
    """The per-sample features of FEATURES (the first three) for rows a..b; ``labels`` are
    all M labels (the neighbours index into them)."""
    yh = labels[a:b]
    return np.stack([_logit(probs[a:b].max(1)), _logit(s.mean_prob[np.arange(a, b), yh]),
                     label_consistency(labels, s.neighbours[a:b], own=yh)], 1)


def _cell(labels: np.ndarray, c: int, s: Signals) -> np.ndarray:
    """The per-cell features of FEATURES (the last three)."""
    hist = np.bincount(labels, minlength=c) / max(1, len(labels))
    # a balanced target's labels spread over all classes, wrong parties' pile onto a few
    # (assumes balanced classes, unless the user gave their frequencies)
    spread = spread_against(hist, s.class_prior)
    return np.array([_logit(s.local_confidence), s.pairwise_agreement, _logit(spread)])


def _logits_full(probs: np.ndarray, s: Signals, w: np.ndarray, block: int = 65536
                 ) -> np.ndarray:
    """features(probs, s) @ w[:-1] + w[-1], by blocks of rows: the (M, 6) float64 matrix is
    never made (1M rows: ~100 MB of temporaries less)."""
    probs = np.asarray(probs)
    m = len(probs)
    labels = probs.argmax(1)
    bias = float(_cell(labels, probs.shape[1], s) @ w[3:6] + w[-1])
    out = np.empty(m)
    for a in range(0, m, block):
        b = min(m, a + block)
        out[a:b] = _per_sample(probs, labels, s, a, b) @ w[:3] + bias
    return out


def fallback_features(probs: np.ndarray, s: Signals) -> np.ndarray:
    """φ(x) (M, len(FALLBACK_FEATURES)) of the earlier model (no neighbourhoods)."""
    probs = np.asarray(probs)
    m = len(probs)
    idx = np.arange(m)
    yh = probs.argmax(1)
    ens = (s.mean_prob.argmax(1) == yh).astype(np.float64)
    tha = (s.averaged.argmax(1) == yh).astype(np.float64)
    per = np.stack([_logit(probs.max(1)), _logit(s.consensus[idx, yh]), s.votes[idx, yh],
                    _logit(s.mean_prob[idx, yh]), ens, _logit(s.averaged[idx, yh]), tha], 1)
    cell = np.array([_logit(s.local_confidence), s.pairwise_agreement, ens.mean(), tha.mean(),
                     _logit(probs.max(1).mean())])
    return np.concatenate([per, np.broadcast_to(cell, (m, len(cell)))], 1)


@dataclass
class Calibration:
    """confidence (M,): P(label right) under the calibrator. estimated_accuracy: its mean;
    plus_minus: the ± of that estimate. temperature: T with mean max softmax(log p / T) =
    estimated_accuracy (for ``mrtf label``). method: how it was obtained. reading: which rule
    printed the estimate, one of mrtf.trust.midpoint_estimate.READINGS."""

    confidence: np.ndarray
    estimated_accuracy: float
    plus_minus: float
    temperature: float
    method: str
    notes: list[str] = field(default_factory=list)
    reading: str = "calibrator"

    def attrs(self) -> dict[str, Any]:
        """What the labels file's ``calibration`` attribute records."""
        d = asdict(self)
        d.pop("confidence")
        return d

    def line(self) -> str:
        return (f"estimated accuracy {self.estimated_accuracy:.3f} "
                f"(±{self.plus_minus:.3f}; label-free, {self.method})")


def band_error(estimate: float, classes: int | None = None,
               bands: tuple[tuple[float, float], ...] = ERROR_BANDS) -> float:
    """The ± that 9 in 10 out-of-sample estimates at this level held (:data:`ERROR_BANDS`).

    In the lowest band, given the number of ``classes``, the ± also reaches down to chance
    (1/classes): an estimate that says most labels are wrong cannot tell "mostly wrong" from
    "no better than guessing" (confidently wrong parties that agree look like weakly right
    ones), and its misses there were all too high, by up to 18 points
    (docs/benchmarks/calibration.md, "The lowest band reaches chance")."""
    err = next((e for lo, e in bands if estimate >= lo), bands[-1][1])
    return max(err, estimate - 1.0 / classes) if classes and in_lowest_band(estimate, bands) \
        else err


def in_lowest_band(estimate: float, bands: tuple[tuple[float, float], ...] = ERROR_BANDS
                   ) -> bool:
    """Whether ``estimate`` lies in the lowest band of :data:`ERROR_BANDS` (most labels read
    as wrong; its ± reaches down to chance)."""
    return len(bands) == 1 or estimate < bands[-2][0]


def plus_minus(estimate: float, m: int, grid_error: float = GRID_ERROR) -> float:
    """± of an accuracy estimate on m samples: 2 binomial standard errors, or the
    estimator's out-of-sample error (``grid_error``) when that is larger."""
    sampling = 2 * math.sqrt(max(estimate * (1 - estimate), 1e-6) / max(m, 1))
    return float(max(sampling, grid_error))


def temperature_for(probs: np.ndarray, target_mean: float, block: int = 65536,
                    device: str | torch.device = "cpu") -> float:
    """T such that mean_x max softmax(log p(x) / T) = target_mean (bisection on log T; the
    mean max probability falls as T grows). Clipped to [0.05, 100]. On the CPU by blocks of
    rows: no (M, C) float64 temporaries (1M × 10: ~300 MB less at the peak); on another
    ``device`` (CUDA) :func:`temperature_torch`."""
    probs = np.asarray(probs)
    if torch.device(device).type != "cpu":
        return temperature_torch(probs, target_mean, device, block)
    m = len(probs)

    def mean_max(t: float) -> float:
        total = sum(float(_tempered_max(probs[a:a + block], t).sum())
                    for a in range(0, m, block))
        return total / max(1, m)

    return _bisect(mean_max, target_mean, probs.shape[1])


def temperature_torch(probs: np.ndarray, target_mean: float, device: str | torch.device,
                      block: int = 65536) -> float:
    """:func:`temperature_for` in torch on ``device``: log p (clipped as on the CPU, float64)
    moved there once, a block of rows at a time, and held (M · C · 8 bytes: 80 MB at
    1M × 10); each of the 50 bisection steps is one softmax on the device. The same T as
    the CPU's up to the order of the sums over M (tests/trust/test_calibration_device.py)."""
    probs = np.asarray(probs)
    dev = torch.device(device)
    logp = torch.cat([torch.from_numpy(np.ascontiguousarray(probs[a:a + block])).to(dev)
                      .double().clamp(1e-12, 1.0).log() for a in range(0, len(probs), block)])

    def mean_max(t: float) -> float:
        return float(torch.softmax(logp / t, 1).max(1).values.sum()) / max(1, len(probs))

    return _bisect(mean_max, target_mean, probs.shape[1])


def _bisect(mean_max: Callable[[float], float], target_mean: float, c: int) -> float:
    """log T by 50 halvings of [log 0.05, log 100] (mean_max falls as T grows), for the
    target clipped into (1/C, 1)."""
    target = float(np.clip(target_mean, 1.0 / c + 1e-6, 1 - 1e-6))
    lo, hi = math.log(0.05), math.log(100.0)
    for _ in range(50):
        mid = (lo + hi) / 2
        if mean_max(math.exp(mid)) > target:
            lo = mid
        else:
            hi = mid
    return float(math.exp((lo + hi) / 2))


def _tempered_max(rows: np.ndarray, t: float) -> np.ndarray:
    """max softmax(log p / t) of a block of rows, float64."""
    logp = np.log(np.clip(np.asarray(rows, dtype=np.float64), 1e-12, 1.0))
    return _softmax(logp / t).max(1)


def apply_temperature(probs: np.ndarray, temperature: float, block: int = 65536
                      ) -> np.ndarray:
    """max softmax(log p / T) per row: the confidence ``mrtf label`` writes, and the values
    refine's confidence takes (confidence_shape.py); by blocks of rows, as
    :func:`temperature_for`: no (M, C) float64 temporaries."""
    probs = np.asarray(probs)
    out = np.empty(len(probs), dtype=np.float32)
    for a in range(0, len(probs), block):
        out[a:a + block] = _tempered_max(probs[a:a + block], float(temperature))
    return out


def calibrate(probs: np.ndarray, signals: Signals,
              coef: tuple[float, ...] | np.ndarray | None = None,
              device: str | torch.device = "cpu", fit_temperature: bool = True
              ) -> Calibration:
    """Calibrated confidence of the labels argmax(probs) from label-free ``signals``: the
    model with the target's neighbourhoods when ``signals.neighbours`` is set, else the
    fallback model (said so in the notes). ``coef`` overrides the constants (the bench's
    leave-one-scenario-out fits). ``device``: where the temperature is fitted
    (:func:`temperature_for`; the refine's device). ``fit_temperature=False`` leaves it at
    1.0, for a caller that reads only the estimate or fits its own (50 passes over the
    probabilities: seconds at a million rows)."""
    full = signals.neighbours is not None
    w = np.asarray((COEF if full else FALLBACK_COEF) if coef is None else coef, np.float64)
    z = _logits_full(probs, signals, w) if full else \
        fallback_features(probs, signals) @ w[:-1] + w[-1]
    conf = (1.0 / (1.0 + np.exp(-z))).astype(np.float32)
    est = float(conf.mean())
    err = band_error(est, probs.shape[1]) if full else FALLBACK_GRID_ERROR
    notes = [] if full else ["the target's neighbourhoods were not computed: the fallback "
                             f"calibrator (grid error {FALLBACK_GRID_ERROR}) was used"]
    if full and signals.class_prior is not None:
        notes.append("the labels' spread was read against the class frequencies given")
    if full and err > band_error(est):
        notes.append(f"most labels are read as wrong, and at {est:.3f} the estimate cannot tell "
                     f"how wrong: its ± reaches down to chance (1/{probs.shape[1]})")
    return Calibration(conf, est, plus_minus(est, len(conf), err),
                       temperature_for(probs, est, device=device) if fit_temperature else 1.0,
                       "grid-fitted logistic model of label-free signals"
                       + ("" if full else " (fallback, no neighbourhoods)"), notes)


def own_confidence(probs: np.ndarray) -> float:
    """The labels' own mean max probability (float64 sum; no (M, C) float64 copy)."""
    return float(np.asarray(probs).max(1).astype(np.float64).mean())


def uncalibrated(probs: np.ndarray, temperature: float | None = None,
                 why: str = "the model carries no calibration (mrtf.calibration)"
                 ) -> Calibration:
    """Confidence of one model alone (``mrtf label``; ``refine --method fedavg``, which has no
    teachers): its max probability at ``temperature`` (the refined model's, from its bundle)
    or as it is, said so with ``why``."""
    if temperature is None:
        conf = np.asarray(probs, dtype=np.float32).max(1)
        est = float(conf.mean())
        return Calibration(conf, est, plus_minus(est, len(conf)), 1.0,
                           "the model's max probability, uncalibrated",
                           [f"{why}: its confidence and this estimate are its own max "
                            "probability, usually optimistic"], "uncalibrated")
    conf = apply_temperature(probs, temperature)
    est = float(conf.mean())
    return Calibration(conf, est, plus_minus(est, len(conf)), float(temperature),
                       f"temperature {temperature:.3g} set when the model was refined", [],
                       "tempered")
