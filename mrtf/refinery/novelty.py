"""Is the target new to the parties? The adaptive refinery's choice between voting and adapting.

The consensus (consensus.py) treats the parties' models as independent annotators. That holds
when the target looks like the parties' data: their errors then differ and a vote corrects
them. It fails when the target is new to all of them (another domain, or a federation trained
to convergence on data unlike the target): they share the same blind spots, their errors
agree, and the vote confirms them. Measured on bench/label_quality.py (3 seeds, 1,000 target
images; see README): on mnist5k→mnistm5k the consensus gave 0.446 against 0.476 for the plain
parameter average θ_{t+1}, and SHOT-style adaptation of θ_{t+1} (shot.py) gave 0.505.

The signal is the parties' own: a party reports its training loss L_k (the mean cross-entropy
of its local steps, ``mrtf.train_loss``, the L̄ of Eq. 10), and the pilot party measures the
entropy H_k of the same model's predictions on the target. A calibrated model's entropy on data
like its own is about its loss there, plus the generalisation gap of a model fit to its data;
a model far less sure on the target than that (H - L > NOVELTY_GAP nats, medians over the
parties) is looking at something new. Then the refined model is θ_{t+1} adapted to the target
(SHOT: information maximisation + clustering pseudo-labels, Liang et al. 2020) instead of
θ_{t+1} distilled toward the vote.

Measured gaps (bench/label_quality.py, bench/inloop_branches.py, mrtf demo): domain shift
0.33-1.15 (mnist5k→mnistm5k at T=30 and T=200, digits→mnist5k at T=200: SHOT beat the vote
by 4.2-15.8 points); in-domain federations fit to their data 0.13-0.28 (50 FedAvg rounds,
where SHOT gained 0.5-2.8 points; the rounds of an evaluation run on label:3, where it lost up
to 16.6; the demo's 10 Dirichlet rounds, where it lost 2.6); one-shot parties and early rounds
-1.01 to +0.01 (the vote won in 17 of 18). 0.3 adapts only the first group: the second gains
too little where SHOT wins to pay for where it loses. Medians, so one party lying about its
loss (claiming 0) cannot flip the choice; parties that report no loss give no signal, and
without a signal the refinery votes (the behaviour before).

The claims miss parties trained with label smoothing and augmented inputs (SHOT's source
recipe): their reported loss is high by construction. USPS → MNIST, ten IID parties, seed 0:
gap 0.13, so the vote (0.840) where SHOT gave 0.976. A second reading needs no claim: for
parties with BatchNorm, how far the target's features are from the statistics their weights
carry (feature_shift.py). The rule: **adapt when the loss gap exceeds NOVELTY_GAP, or when
every party has BatchNorm, their median feature shift exceeds FEATURE_SHIFT and the parties
agree on at least MIN_AGREEMENT of the target** (mean pairwise agreement of their labels).
The agreement condition keeps the second reading off label-skewed parties, for two reasons
measured there: their statistics hold a few classes each, so an in-domain target reads as
shifted (mnist5k, five Dirichlet 0.1 parties from one start: 0.135-0.175, agreeing on
0.13-0.22), and adapting θ_{t+1} is a gamble the shift cannot foresee (USPS → MNIST Dirichlet
0.1, agreement 0.16: seed 0 adapted 0.907; seed 1, shift 0.282, gap 0.28: SHOT collapsed to
0.604 and the vote gave 0.881). Both readings, measured on every cached standard-digits
received set and in-domain controls: docs/benchmarks/novelty.md. Plain networks (the in-house
grid's LeNets) have no BatchNorm: the loss gap alone decides there, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from mrtf.compute.softmax_rows import agreeing_pairs, entropy_sums
from mrtf.device import off_cpu
from mrtf.refinery.feature_shift import FEATURE_SHIFT, FeatureShift

#: H - L (nats) above which the target counts as new to the parties (chosen on the runs above)
NOVELTY_GAP = 0.3
#: the parties' mean pairwise label agreement on the target below which the feature shift is
#: not read (Dirichlet 0.1 shards: 0.13-0.27; Dirichlet 0.5: 0.21-0.66; IID: 0.76-0.99)
MIN_AGREEMENT = 0.3


@dataclass(frozen=True)
class Novelty:
    """gap: median target entropy - median reported training loss (None: too few reports).
    adapt: True → adapt θ_{t+1} to the target (SHOT) instead of distilling the vote.
    feature_shift: the parties' median BatchNorm feature shift (feature_shift.py; None: some
    party has no BatchNorm); agreement: their mean pairwise label agreement on the target
    (None when there is no feature shift to read); by: which reading said adapt ('loss gap',
    'feature shift') or None."""

    gap: float | None
    target_entropy: float
    train_loss: float | None
    adapt: bool
    feature_shift: float | None = None
    agreement: float | None = None
    by: str | None = None

    def line(self) -> str:
        what = ("new to the parties: θ_{t+1} is adapted to it (SHOT, then distilled to its "
                "own neighbour vote), their shared errors would outvote it" if self.adapt
                else "like the parties' data: their vote is distilled (unless one party only)")
        if self.gap is None:
            claims = ("target novelty: unknown from the claims (fewer than half of the "
                      "parties reported a training loss)")
            if self.feature_shift is None:
                return f"{claims}, so the parties' vote is distilled (unless one party only)"
            return f"{claims}; {self.shift_text()}: {what}"
        out = (f"target novelty: the parties' entropy on it {self.target_entropy:.3f} vs "
               f"their training loss {self.train_loss:.3f} nats (gap {self.gap:+.3f}, "
               f"threshold {NOVELTY_GAP})")
        if self.feature_shift is not None:
            out += f"; {self.shift_text()}"
        return f"{out}: {what}"

    def shift_text(self) -> str:
        """The feature-shift reading in words (only when there is one)."""
        read = ("read" if self.agreement is not None and self.agreement >= MIN_AGREEMENT
                else f"not read: under {MIN_AGREEMENT}")
        return (f"their BatchNorm feature shift {self.feature_shift:.3f} (threshold "
                f"{FEATURE_SHIFT}; they agree on {self.agreement or 0.0:.2f} of the target, "
                f"{read})")

    def to_dict(self) -> dict[str, Any]:
        """The earlier keys and ``line`` first (as before the feature shift), then the added
        ones."""
        d = asdict(self)
        first = ("gap", "target_entropy", "train_loss", "adapt")
        return {**{k: d[k] for k in first}, "line": self.line(),
                **{k: v for k, v in d.items() if k not in first}}


def mean_entropies(logits, k: int, block_bytes: int = 2**25,
                   device: torch.device | None = None) -> np.ndarray:
    """Mean entropy (nats) of softmax(logits) over the target, per model, (k,) float64.
    logits: (K, M, C) or anything indexed ``a[:k, s:e]`` like it (the streaming path's
    spill), read in blocks of about ``block_bytes`` of float64 (memory flat in M).
    ``device`` other than the CPU: the same sums in torch there (compute.softmax_rows)."""
    m, c = logits.shape[1], logits.shape[2]
    block = max(1, block_bytes // (8 * max(1, k) * c))
    if (dev := off_cpu(device)) is not None:
        return entropy_sums(logits, k, block, dev) / max(1, m)
    total = np.zeros(k)
    for s in range(0, m, block):
        z = np.asarray(logits[:k, s:s + block], dtype=np.float64)
        z = z - z.max(2, keepdims=True)
        logp = z - np.log(np.exp(z).sum(2, keepdims=True))
        total += -(np.exp(logp) * logp).sum((1, 2))
    return total / max(1, m)


def mean_agreement(logits, k: int, block_bytes: int = 2**25,
                   device: torch.device | None = None) -> float:
    """Mean over the pairs of the first k models of the fraction of the target on which their
    labels (argmax) agree; 1.0 for one model. Read in blocks like :func:`mean_entropies`."""
    m, c = logits.shape[1], logits.shape[2]
    if k < 2 or not m:
        return 1.0
    block = max(1, block_bytes // (8 * k * c))
    if (dev := off_cpu(device)) is not None:
        return agreeing_pairs(logits, k, block, dev) / (m * k * (k - 1) / 2)
    same = 0.0
    for s in range(0, m, block):
        labels = np.asarray(logits[:k, s:s + block]).argmax(2)  # (k, b)
        for i in range(k - 1):
            same += float((labels[i + 1:] == labels[i]).sum())
    return same / (m * k * (k - 1) / 2)


def target_novelty(local_logits, train_losses: Sequence[float | None],
                   gap: float = NOVELTY_GAP, num_local: int | None = None,
                   shift: FeatureShift | None = None,
                   device: torch.device | None = None) -> Novelty:
    """Novelty of the target for the local models: local_logits (K, M, C) (or anything
    indexed like it, see :func:`mean_entropies`) whose first ``num_local`` (default: all)
    are the local models, train_losses the losses the parties reported
    (None: not reported; with the trust layer, only the trusted parties' claims), ``shift``
    the same models' BatchNorm feature shift (feature_shift.py; None or no reading: the loss
    gap alone). The rule: the module docstring. Pure; y is never read. ``device``: where the
    logits are read (the CPU: numpy)."""
    k = local_logits.shape[0] if num_local is None else num_local
    h = float(np.median(mean_entropies(local_logits, k, device=device))) if k else 0.0
    fs = shift.shift if shift is not None and k else None
    agree = mean_agreement(local_logits, k, device=device) if fs is not None else None
    by_shift = bool(shift is not None and shift.shifted and agree is not None
                    and agree >= MIN_AGREEMENT)
    reported = [float(x) for x in train_losses if x is not None and np.isfinite(x)]
    if not k or not reported or 2 * len(reported) < len(train_losses):
        return Novelty(None, h, None, by_shift, fs, agree, "feature shift" if by_shift else None)
    loss = float(np.median(reported))
    by_gap = h - loss > gap
    by = "loss gap" if by_gap else ("feature shift" if by_shift else None)
    return Novelty(h - loss, h, loss, by_gap or by_shift, fs, agree, by)
