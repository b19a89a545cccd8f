"""Where the adapt branch starts: θ_{t+1}, or the vote's student. Both are adapted; the one
whose labels carry more information about the target, and are no less diverse, is kept.

SHOT (Liang et al. 2020) adapts a model by its own pseudo-labels: its first centroids are the
start's own predictions (SHOT Eq. 4-6), so a start that is a poor classifier of the target
stays one. θ_{t+1}, the parameter average, is such a start when the parties' data were far
apart: ten one-shot MNIST parties with Dirichlet 0.1 shares averaged to a model that labelled
0.19-0.32 of USPS right, and on one seed put nearly all of it in one class (its labels'
entropy 0.24 nats, of ln 10 = 2.30). The student the vote branch distils (θ_{t+1} taught the
parties' consensus, Eq. 1-2) starts from what the parties agree on instead, but distilling
first can also cost: on ten Dirichlet-0.5 parties SHOT from the student lost 7-15 points
against SHOT from θ_{t+1} on three of the sets where θ_{t+1} was a fair start. Neither start
wins everywhere, and none of the readings taken before adapting (θ_{t+1}'s agreement with the
ensemble, the entropy of its labels) told the winners apart (docs/benchmarks/
standard-digits.md, "Where the adapt branch starts").

So both are adapted and settled (fit.py), and the refinery keeps the one whose labels (after
the neighbour vote) score the higher **information** on the target,

    I(p) = H(mean_i p_i) - mean_i H(p_i),

the mutual information between a sample and its label under the model: confident labels
(small H(p_i)) spread over the classes (large H of their mean). It is SHOT's own objective
(the information-maximisation loss L_ent + L_div of SHOT Eq. 2-3, negated), read once on each
result; no label is read. A collapsed adaptation (most of the target in a few classes) scores
low on the first term, an unsure one on the second.

Two confident, spread-out labellings score alike, whichever is right: on ten IID parties
(MNIST → USPS, seeds 0-2) the student's labels scored 0.010-0.015 nats more and were 0.8
points better, 0.8 and 15.7 worse. So a difference under :data:`TIE` × ln C is a tie, and a
tie keeps θ_{t+1}, SHOT's own start; the smallest lead that kept the student where it was
better was 0.033 (MNIST → USPS framed). TIE was chosen on those sets (in-sample).

A lead in I must also not come from the confidence term alone. The student was distilled
first, and distilling makes a model surer of its labels whether or not they are right (on
the label-quality grid's plain LeNets the student's labels scored the higher I on all three
sets and were worse on two); what it cannot fake is the spread: a student that inherited
the vote's merged classes (ten Dirichlet-0.1 parties that hardly saw a "7" label it "9")
gives less diverse labels than θ_{t+1}. So a start leads only if its labels are also no
less **diverse**, H(mean_i p_i) (SHOT's L_div), than the first start's, within the same
tie: USPS → MNIST, ten Dirichlet-0.1 parties, seed 0: the student led in I by 0.155 nats
with labels 0.049 nats less diverse, and was 7.6 points worse. This condition was chosen on
10 received sets and checked on 20 others, 15 of them of new seeds; it changed no choice
there (docs/benchmarks/standard-digits.md, "The diversity condition, and seeds 3-5").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from mrtf.refinery.rectify import entropy

#: a lead in information under TIE × ln C (nats) is a tie, kept by the first start
TIE = 0.01
#: the two starts, in the order they are adapted (the first is kept on a tie)
AVERAGE = "θ_{t+1}"
VOTE_STUDENT = "the vote's student"


def _rows(probs: np.ndarray, what: str) -> np.ndarray:
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2 or len(p) == 0:
        raise ValueError(f"{what} needs (M, C) probabilities with M >= 1, got shape {p.shape}")
    return p


def label_diversity(probs: np.ndarray) -> float:
    """H(mean p) in nats, of (M, C) label probabilities (SHOT's L_div, negated): 0 when every
    row puts all its mass on one class, ln C when the classes are given equally often."""
    return float(entropy(_rows(probs, "label_diversity").mean(0)))


def label_information(probs: np.ndarray) -> float:
    """I(p) = H(mean p) - mean H(p) in nats, of (M, C) label probabilities: between 0 (every
    row the same, or every row uniform) and ln C (one-hot rows, classes equally often)."""
    p = _rows(probs, "label_information")
    return label_diversity(p) - _mean_entropy(p)


def _mean_entropy(p: np.ndarray) -> float:
    """mean H(p) in nats of (M, C) rows already checked by :func:`_rows`."""
    return float(entropy(p).mean())


@dataclass(frozen=True)
class StartChoice:
    """kept: the start kept (AVERAGE or VOTE_STUDENT); information: every start's score I
    (nats), in the order adapted; diversity: every start's H(mean p) (nats)."""

    kept: str
    information: dict[str, float] = field(default_factory=dict)
    diversity: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        scores = ", ".join(f"{k} {v:.3f}" + (f" (diversity {self.diversity[k]:.3f})"
                                              if k in self.diversity else "")
                           for k, v in self.information.items())
        return (f"adapted from {len(self.information)} starts, kept {self.kept} "
                f"(the labels' information on the target, nats: {scores})")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_start(labels: Mapping[str, np.ndarray]) -> StartChoice:
    """The start (a key of ``labels``: its adapted model's label probabilities (M, C)) to
    keep: the first, unless another leads it in :func:`label_information` by more than
    :data:`TIE` × ln C and trails it in :func:`label_diversity` by no more than that (then,
    of those, the one that leads most)."""
    if not labels:
        raise ValueError("choose_start needs at least one start")
    rows = {name: _rows(p, "choose_start") for name, p in labels.items()}
    spread = {name: label_diversity(p) for name, p in rows.items()}
    # I = H(mean p) - mean H(p): the diversity just computed, not computed again
    info = {name: spread[name] - _mean_entropy(p) for name, p in rows.items()}
    first = next(iter(info))
    num_classes = next(iter(labels.values())).shape[-1]
    margin = TIE * float(np.log(max(num_classes, 2)))
    leads = [name for name in info if info[name] > info[first] + margin
             and spread[name] >= spread[first] - margin]
    kept = max(leads, key=lambda name: info[name]) if leads else first
    return StartChoice(kept, info, spread)
