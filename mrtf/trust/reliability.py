"""Party reliability measured on the pilot party's own unlabeled target data (issue 13).

The pilot party cannot audit the parties that send it models, but it can watch every received
model behave on its target set. For each local model this module measures

- **agreement**: how often its label is the leave-one-out consensus' label (the others'
  AvgProb, Eq. 7, without it), and **mapped agreement**: the same after renaming each of its
  classes to the consensus class it most often stands for. A label-flipped party (trained on
  y + 1) agrees almost never but maps almost perfectly, with many classes moved: its
  predictions are a relabelling;
- its **prediction histogram** against the consensus' (total variation), its **confidence**;
- its **weight-space distance** from the coordinate-wise median of the parties' weights,
  relative to the median party's distance, and its weight norm relative to the median norm
  (random weights, weights × 100), and whether its **output layer is θ_t's with the class
  rows renamed** (mrtf.trust.weights; parties too weak for the behavioural checks);
- its **claims** (``n_samples``, ``train_loss``) against the others' and against its behaviour:
  an n_samples above :data:`CLAIM_CAP` × the median claim is refused (weighted as the median).

and gives a verdict: ``trusted``, ``down-weighted`` (averaging and ensemble weight ×
:data:`DOWN_WEIGHT`) or ``excluded`` (left out of the parameter average and the ensemble), with
the reasons. The target's ``y`` is never read. The thresholds were set on the 26 clean received
sets of the label-quality grid (none flagged there) and the poisoned sets of bench/poison.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from mrtf.trust.weights import renamed_outputs, statistics_norm, weight_geometry

#: a claimed n_samples above CLAIM_CAP × the median claim is refused (weighted as the median)
CLAIM_CAP = 3.0
#: averaging / ensemble weight factor of a down-weighted party
DOWN_WEIGHT = 0.5
#: weight-space outlier: distance from the median > WEIGHT_DIST_MAX × the median distance, or
#: a weight norm outside [1 / WEIGHT_NORM_MAX, WEIGHT_NORM_MAX] × the median norm
WEIGHT_DIST_MAX = 4.0
WEIGHT_NORM_MAX = 3.0
#: BatchNorm running statistics (mrtf.trust.weights.statistics_norm): a norm outside
#: [1 / STATS_NORM_MAX, STATS_NORM_MAX] × the median party's. A variance scales as the square
#: of the weights before it, so weights within WEIGHT_NORM_MAX give statistics within its
#: square (clean parties on mnist5k: up to 2.9× from their own starts, 2.0× from one start)
STATS_NORM_MAX = WEIGHT_NORM_MAX ** 2
#: relabelling: mapped agreement exceeds agreement by RELABEL_GAP and agreement is below half
#: the mapped agreement
RELABEL_GAP = 0.3
#: ... and the one-to-one renaming moves at least RELABEL_MOVED × C classes (≥ 3) and explains
#: at least RELABEL_MAPPED of the samples
RELABEL_MOVED = 0.4
RELABEL_MAPPED = 0.5
#: or, wherever they hardly agree (another domain): agreement < RELABEL_RATIO × the renamed
RELABEL_RATIO = 0.25
#: disagreement outlier: agreement below AGREE_FRACTION × the median party's agreement and a
#: robust z-score below -AGREE_Z, judged only with ≥ AGREE_MIN_PARTIES parties whose median
#: agreement is ≥ AGREE_MIN_MEDIAN (when the parties hardly agree among themselves, weak or
#: narrow models on a shifted domain, disagreeing is no evidence of poison)
AGREE_FRACTION = 0.5
AGREE_Z = 3.0
AGREE_MIN_PARTIES = 5
AGREE_MIN_MEDIAN = 0.3
#: renamed output layer: the best matching of its class rows to θ_t's moves at least
#: RENAME_MOVED × C rows (≥ 3) at ≤ RENAME_COST × the identity's squared distance. On 54 clean
#: received sets (the label-quality grid, the fresh cells and bench/scale.py's weak parties;
#: against θ_t and against the others' median alike; bench/renamed_rows.py) no party moved
#: more than 4 of 10 rows (at 0.65-0.98× the cost); the same sets with one party's rows
#: rolled by one class moved 9-10 rows at 0.00-0.84× in every set
RENAME_MOVED = 0.6
RENAME_COST = 0.9
#: a claimed train_loss below LOSS_FRACTION × the median claim is "implausibly low" when the
#: party's agreement is also below the median party's
LOSS_FRACTION = 0.1

#: a claimed train_loss below this (cross-entropy, e.g. exactly 0) is no real training loss
ZERO_LOSS = 1e-6

VERDICTS = ("trusted", "down-weighted", "excluded")


@dataclass
class PartyReliability:
    """What the target set says about one received local model.

    name: the party. agreement: fraction of target samples where its label equals the
    leave-one-out consensus' label. mapped_agreement: the same after the best one-to-one
    renaming of its classes (Hungarian); moved_classes: how many classes (each ≥ 2 % of the
    samples) that renaming moves. histogram_tv: total variation
    between its predicted-class histogram and the leave-one-out consensus'. confidence: mean
    max softmax probability. weight_distance: ‖θ_k − median‖ / the median party's distance
    (None when the parties' architectures differ or fewer than 3 share it). weight_norm: ‖θ_k‖ /
    the median norm (None likewise); both over the trained parameters. statistics_norm: the
    norm of its BatchNorm running statistics / the median party's (None: none, or not
    comparable). renamed_rows, rename_cost: how many of its output layer's
    class rows the best matching to θ_t's (else the others' median) rows moves, and at what
    fraction of the identity's squared distance (mrtf.trust.weights; None where not
    measured). claimed_samples, claimed_loss: its metadata.
    weight: its share of the parameter average (0 when excluded; a refused claim: the median's).
    verdict: 'trusted' | 'down-weighted' | 'excluded'. reasons: why, in words.
    """

    name: str
    agreement: float
    mapped_agreement: float
    moved_classes: int
    histogram_tv: float
    confidence: float
    weight_distance: float | None
    weight_norm: float | None
    claimed_samples: int | None
    claimed_loss: float | None
    renamed_rows: int | None = None
    rename_cost: float | None = None
    statistics_norm: float | None = None
    weight: float = 0.0
    verdict: str = "trusted"
    reasons: list[str] = field(default_factory=list)
    #: the reasons that are refused claims (n_samples as the median claim, train_loss unused)
    refused_claims: list[str] = field(default_factory=list)

    @property
    def claims_only(self) -> bool:
        """Flagged for its claims alone: nothing it does on the target or in its weights."""
        return bool(self.reasons) and all(r in self.refused_claims for r in self.reasons)

    @property
    def factor(self) -> float:
        """Multiplier of its ensemble / consensus and averaging weight (1, DOWN_WEIGHT or 0);
        1 for claims alone: refusing the claim is the answer (docs/benchmarks/takeover.md)."""
        if self.verdict == "down-weighted" and self.claims_only:
            return 1.0
        return {"trusted": 1.0, "down-weighted": DOWN_WEIGHT, "excluded": 0.0}[self.verdict]

    def line(self) -> str:
        why = f" ({'; '.join(self.reasons)})" if self.reasons else ""
        return f"{self.name}: {self.verdict}{why}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ReliabilityReport:
    """parties: one PartyReliability per local model, in the order given. weights: the
    parameter-average weights (sum 1 over the parties not excluded). notes: what was not
    measured and why."""

    parties: list[PartyReliability]
    weights: list[float]
    notes: list[str] = field(default_factory=list)

    @property
    def excluded(self) -> list[int]:
        return [i for i, p in enumerate(self.parties) if p.verdict == "excluded"]

    @property
    def flagged(self) -> list[PartyReliability]:
        return [p for p in self.parties if p.verdict != "trusted"]

    def factors(self) -> list[float]:
        return [p.factor for p in self.parties]

    def rows(self) -> list[list[Any]]:
        """Table rows for the CLI (party, agreement, mapped, hist TV, confidence, weight
        distance, norm, BatchNorm statistics' norm, renamed output rows, claimed n, claimed
        loss, avg weight, verdict, why)."""
        def f(v: float | None, fmt: str = ".3f") -> str:
            return "-" if v is None else format(v, fmt)

        def renamed(p: PartyReliability) -> str:
            return "-" if p.renamed_rows is None else \
                f"{p.renamed_rows} ({p.rename_cost:.2f})" if p.renamed_rows else "0"

        return [[p.name, f(p.agreement), f(p.mapped_agreement), f(p.histogram_tv),
                 f(p.confidence), f(p.weight_distance, ".2f"), f(p.weight_norm, ".2f"),
                 f(p.statistics_norm, ".2f"), renamed(p),
                 "-" if p.claimed_samples is None else p.claimed_samples, f(p.claimed_loss),
                 f(p.weight), p.verdict, "; ".join(p.reasons) or "-"] for p in self.parties]

    HEADER = ["party", "agree", "mapped", "hist TV", "conf", "w-dist", "w-norm", "bn-stats",
              "renamed", "claims n", "claims loss", "avg weight", "verdict", "why"]


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def behaviour(probs: np.ndarray) -> list[dict[str, float]]:
    """Agreement, mapped agreement, histogram TV and confidence of each of the K models
    (probs (K, M, C) softmax) against the leave-one-out AvgProb of the others."""
    k, m, c = probs.shape
    total = probs.sum(0)
    picks = probs.argmax(2)
    out = []
    for i in range(k):
        loo = (total - probs[i]) / max(1, k - 1) if k > 1 else probs[i]
        ref = loo.argmax(1)
        joint = np.zeros((c, c))
        np.add.at(joint, (picks[i], ref), 1.0)
        hist_k = np.bincount(picks[i], minlength=c) / m
        hist_ref = np.bincount(ref, minlength=c) / m
        rows, cols = linear_sum_assignment(-joint)  # the best one-to-one renaming
        # classes the renaming moves, each carrying ≥ 2 % of the samples: a relabelling moves
        # many classes; a weak or narrow model "moves" at most one or two
        moved = int(sum(joint[r, c_] >= 0.02 * m for r, c_ in zip(rows, cols) if r != c_))
        out.append({"agreement": float((picks[i] == ref).mean()),
                    "mapped_agreement": float(joint[rows, cols].sum() / m),
                    "moved_classes": moved,
                    "histogram_tv": float(0.5 * np.abs(hist_k - hist_ref).sum()),
                    "confidence": float(probs[i].max(1).mean())})
    return out


def _robust_z(values: np.ndarray) -> np.ndarray:
    med = np.median(values)
    mad = 1.4826 * np.median(np.abs(values - med))
    return (values - med) / max(mad, 0.02)  # a floor: identical clean parties have MAD ~0


def assess(names: Sequence[str], logits: np.ndarray,
           states: Sequence[dict[str, torch.Tensor]] | None = None,
           n_samples: Sequence[int | None] | None = None,
           train_losses: Sequence[float | None] | None = None,
           reference: dict[str, torch.Tensor] | None = None,
           shared_start: bool = True) -> ReliabilityReport:
    """Reliability of K local models from their target logits (K, M, C) (and, optionally,
    their weights and claims). Never reads labels.

    names: the parties. states: their state dicts (weight-space checks when ≥ 3 share one
    architecture). n_samples, train_losses: what they claim (None where not claimed).
    reference: θ_t's state dict, the round's starting model (the renamed-output check
    compares with its output rows; without it, with the other parties' median). A reference
    against which most parties' rows look renamed is the odd one out: refused, with a note.
    shared_start: whether the parties trained from one start (mrtf.trust.basin); the
    renamed-output check means nothing between independently started networks, so it is
    skipped when False.
    """
    k = len(names)
    logits = np.asarray(logits)
    if logits.shape[0] != k:
        raise ValueError(f"{k} names but logits for {logits.shape[0]} models")
    c = logits.shape[2]
    n_samples = list(n_samples) if n_samples is not None else [None] * k
    train_losses = list(train_losses) if train_losses is not None else [None] * k
    beh = behaviour(_softmax(logits))
    geo = weight_geometry(states) if states is not None else None
    stats = statistics_norm(states) if states is not None else None
    notes = []
    ren = _renamed(states, c, reference, shared_start, notes)
    if geo is None:
        notes.append("weight-space checks skipped (fewer than 3 parties of one architecture)")
    parties = [PartyReliability(names[i], **beh[i],
                                weight_distance=None if geo is None else geo[0][i],
                                weight_norm=None if geo is None else geo[1][i],
                                claimed_samples=n_samples[i], claimed_loss=train_losses[i],
                                renamed_rows=None if ren is None else ren[0][i][0],
                                rename_cost=None if ren is None else ren[0][i][1],
                                statistics_norm=None if stats is None else stats[i])
               for i in range(k)]
    if k < 3:
        notes.append(f"only {k} local models: too few to tell an outlier; all trusted")
        return ReliabilityReport(parties, _avg_weights(parties), notes)
    agree = np.array([p.agreement for p in parties])
    z = _robust_z(agree)
    med_agree = float(np.median(agree))
    losses = [v for v in train_losses if v is not None]
    for i, p in enumerate(parties):
        relabel = _relabel_reasons(p, c)
        excl = _weight_reasons(p, c, "" if ren is None else ren[1]) + relabel
        # a relabelling already says why it disagrees
        down = [] if relabel else _disagreement_reasons(p, z[i], med_agree, k)
        p.refused_claims = _loss_reasons(p, losses, med_agree)
        down += p.refused_claims
        p.reasons = excl + down
        p.verdict = "excluded" if excl else "down-weighted" if down else "trusted"
    _name_refused_claims(parties)
    return ReliabilityReport(parties, _avg_weights(parties), notes)


def _renamed(states, c: int, reference, shared_start: bool, notes: list[str]):
    """:func:`renamed_outputs` where it means something: among parties of one start, against
    θ_t unless θ_t would make most parties look renamed (then against their median)."""
    if states is None:
        return None
    if not shared_start:
        notes.append("renamed-output check skipped: the parties did not train from one start, "
                     "so their class rows need not line up")
        return None
    ren = renamed_outputs(states, c, reference)
    if ren is None or reference is None or ren[1] != "the starting model's":
        return ren
    moved = [m >= max(3, math.ceil(RENAME_MOVED * c)) and cost <= RENAME_COST
             for m, cost in ren[0]]
    if 2 * sum(moved) > len(moved):
        notes.append(f"θ_t refused as the reference: against it {sum(moved)} of {len(moved)} "
                     "parties' output layers look renamed, so θ_t is the odd one out")
        return renamed_outputs(states, c, None)
    return ren


def _weight_reasons(p: PartyReliability, c: int, against: str) -> list[str]:
    """Exclusions the weights alone justify: far from the others, a norm out of range, or
    an output layer whose class rows are ``against``'s (θ_t's, else the other parties'
    median) renamed."""
    out = []
    if p.weight_distance is not None and p.weight_distance > WEIGHT_DIST_MAX:
        out.append(f"weights {p.weight_distance:.1f}× the median party's distance "
                   "from the median")
    if p.weight_norm is not None and not (1 / WEIGHT_NORM_MAX <= p.weight_norm
                                          <= WEIGHT_NORM_MAX):
        out.append(f"weight norm {p.weight_norm:.2g}× the median party's")
    if p.statistics_norm is not None and not (1 / STATS_NORM_MAX <= p.statistics_norm
                                              <= STATS_NORM_MAX):
        out.append(f"BatchNorm running statistics {p.statistics_norm:.2g}× the median "
                   "party's norm")
    if p.renamed_rows is not None and p.renamed_rows >= max(3, math.ceil(RENAME_MOVED * c)) \
            and p.rename_cost <= RENAME_COST:
        out.append(f"its output layer is {against} with {p.renamed_rows} of {c} class rows "
                   f"swapped ({p.rename_cost:.2f}× the distance unswapped)")
    return out


def _relabel_reasons(p: PartyReliability, c: int) -> list[str]:
    """Exclusion when its labels are a relabelling of the others' (many classes moved)."""
    a, mapped = p.agreement, p.mapped_agreement
    if (mapped - a > RELABEL_GAP and a < 0.5 * mapped and mapped >= RELABEL_MAPPED
            or a < RELABEL_RATIO * mapped) and p.moved_classes >= max(3, RELABEL_MOVED * c):
        return [f"its labels are a relabelling of the others' (agrees {p.agreement:.2f}, "
                f"{p.mapped_agreement:.2f} after renaming classes)"]
    return []


def _disagreement_reasons(p: PartyReliability, z: float, med_agree: float, k: int
                          ) -> list[str]:
    """Down-weighting for a party that disagrees with consensus far more than the others
    (judged only among enough parties that agree among themselves)."""
    if k >= AGREE_MIN_PARTIES and med_agree >= AGREE_MIN_MEDIAN and \
            p.agreement < AGREE_FRACTION * med_agree and z < -AGREE_Z:
        return [f"agrees with the others on {p.agreement:.2f} of the samples "
                f"(median party {med_agree:.2f})"]
    return []


def _loss_reasons(p: PartyReliability, losses: list[float], med_agree: float) -> list[str]:
    """Down-weighting for a claimed train_loss no real training reaches, or far below the
    others' while the party agrees less than the median one: its loss is not used."""
    loss = p.claimed_loss
    if loss is not None and loss < ZERO_LOSS:
        return [f"claims train_loss {loss:.3g}, which no trained classifier reaches on real "
                "data: its loss is not used"]
    if loss is not None and len(losses) >= 3 and \
            loss < LOSS_FRACTION * float(np.median(losses)) and p.agreement < med_agree:
        return [f"claims train_loss {loss:.3g} (median claim {float(np.median(losses)):.3g}) "
                "but agrees with the others less than the median party: its loss is not used"]
    return []


def _median_claim(parties: list[PartyReliability]) -> float | None:
    """The median claimed n_samples, when every party claims a positive count (else None)."""
    claims = [p.claimed_samples for p in parties]
    return float(np.median(claims)) if all(isinstance(c, int) and c > 0 for c in claims) else None


def _name_refused_claims(parties: list[PartyReliability]) -> None:
    """A claimed n_samples above CLAIM_CAP × the median claim is named (refused: _avg_weights)."""
    if (median := _median_claim(parties)) is None:
        return
    for p in parties:
        if p.claimed_samples > CLAIM_CAP * median:
            why = (f"claims {p.claimed_samples:,} samples, {p.claimed_samples / median:.0f}× "
                   "the median claim: refused, it is averaged with the median claim's weight")
            p.reasons.append(why)
            p.refused_claims.append(why)
            if p.verdict == "trusted":
                p.verdict = "down-weighted"


def _avg_weights(parties: list[PartyReliability]) -> list[float]:
    """Parameter-average weights: claimed n_samples when every party claims one (a claim above
    CLAIM_CAP × the median counts as the median: a cap there still let an honest model's 10⁶
    claim move θ_{t+1}, docs/benchmarks/takeover.md), else uniform; × the verdict; normalised."""
    median = _median_claim(parties)
    base = [1.0 if median is None else median if p.claimed_samples > CLAIM_CAP * median
            else float(p.claimed_samples) for p in parties]
    raw = [b * p.factor for b, p in zip(base, parties)]
    total = math.fsum(raw)
    if total <= 0:  # every party excluded: fall back to the claims, said by the caller
        raw, total = base, math.fsum(base)
    weights = [r / total for r in raw]
    for p, w in zip(parties, weights):
        p.weight = w
    return weights
