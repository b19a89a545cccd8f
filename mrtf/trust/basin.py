"""Do the parties share a basin? (issue 33 item 3): whether a parameter average means anything.

FedAvg, θ_{t+1} and MrTF's self-teaching (Eq. 10) assume the parties trained from one start and
stayed near it, so that their weights can be averaged. Parties that trained from their own
random starts (separate projects, other frameworks) cannot: hidden units are permuted between
networks, and their average is no classifier (LeNet on digits, 4 parties from 4 seeds: the
average labels 0.11 of the target right, each party 0.56-0.68). Two things tell, both from what
was received and the unlabeled target:

- **weight cosine**: the median cosine between the parties' flattened weight matrices and
  kernels. A shared start keeps it high (0.39-0.88 on digits, 5-30 epochs), independent starts
  near 0 (-0.00-0.08). Per-channel vectors (biases, BatchNorm's γ and β, weight norm's g) are
  left out: every framework starts them at the same constants (1, 0), so they made independent
  starts look alike (5 lenet_shot parties from 5 seeds on mnist5k: 0.32 with them, 0.006
  without; from one start 0.85 and 0.78);
- **the average's agreement**: how often the parameter average's label is the ensemble's
  (the parties' mean softmax), against the median party's own agreement. A working average
  agrees as much as a party or more (0.85 against 0.72 on digits after 5 epochs); a
  meaningless one agrees by chance (0.11-0.13 against 0.63-0.94), even from a shared start
  when the parties trained far from it (30 epochs at lr 0.05 on digits: 0.12 against 0.93).

The renamed-output check (class rows swapped) is applied only among parties of one start; the
parameter average is used only when they share one (a weak average from one start is said, not
dropped: the adaptive default weighs it by its agreement and may adapt it); otherwise the
student starts from the party that agrees most with the ensemble (an unsupervised choice; no
label is read).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from mrtf.trust.selection import flat_weights, select
from mrtf.trust.weights import same_layout

#: parties share a start when the median pairwise cosine of their weights is at least this
SHARED_COSINE = 0.2
#: the median cosine is taken over at most this many parties (a seeded subset of more)
COSINE_SAMPLE = 200
#: from one start, an average that agrees with the ensemble less than this fraction × as often
#: as the median party is said to be weak (not acted on: :attr:`Basin.weak_average`)
AVERAGE_FRACTION = 0.5


@dataclass
class Basin:
    """cosine: median pairwise cosine of the parties' weights (None: layouts differ or fewer
    than 2). average_agreement: fraction of target samples where the parameter average's label
    is the ensemble's (None: not measured). party_agreement: the median party's. best: index
    of the party that agrees most with the ensemble; best_agreement: its agreement;
    agreements: every party's."""

    cosine: float | None
    average_agreement: float | None = None
    party_agreement: float | None = None
    best: int = 0
    best_agreement: float | None = None
    agreements: list[float] = field(default_factory=list)

    @property
    def shared_start(self) -> bool:
        return self.cosine is None or self.cosine >= SHARED_COSINE

    @property
    def average_works(self) -> bool:
        """Whether refine uses the parameter average: when the parties share a start. Near-
        orthogonal weights average to no network (on digits and mnist5k the average of
        independent parties labelled 0.08-0.11 right), even where weak parties agree with the
        ensemble as little as the average does by chance."""
        return self.shared_start

    @property
    def weak_average(self) -> bool:
        """From one start, the average agrees with the ensemble less than AVERAGE_FRACTION ×
        as often as the median party: said, not acted on (the adaptive method weighs θ_{t+1}
        as one source and may adapt it; on the benchmark grid this was measured with it)."""
        return self.average_agreement is not None and self.party_agreement is not None and \
            self.average_agreement < AVERAGE_FRACTION * self.party_agreement

    def line(self, best_name: str | None = None) -> str:
        """One line for the user, said before the long work (``best_name``: the party the
        student starts from; None: the caller gave the student)."""
        cos = "" if self.cosine is None else f"weight cosine {self.cosine:.2f}"
        agree = "" if self.average_agreement is None else \
            (f"the parameter average agrees with the ensemble on {self.average_agreement:.2f} "
             f"of the target (median party {self.party_agreement:.2f})")
        why = "; ".join(x for x in (cos, agree) if x)
        if self.average_works and self.weak_average:
            return (f"parties share a start but trained far from it ({why}): the parameter "
                    "average is still used")
        if self.average_works:
            return f"parties share a basin ({why}): the parameter average is used"
        start = "trained from their own starts"
        who = "the given student" if best_name is None else \
            (f"party {best_name}, which agrees most with the ensemble "
             f"({self.best_agreement:.2f})")
        return f"parties {start} ({why}): no parameter average; the student starts from {who}"


def matrix_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weight matrices and kernels of a state dict: floating-point tensors with at least
    two dimensions larger than 1 (not biases, BatchNorm's γ, β and running statistics, or
    weight norm's g, which start at the same constants from any seed)."""
    return {n: v for n, v in state.items()
            if v.is_floating_point() and sum(d > 1 for d in v.shape) >= 2}


def weight_cosine(states: Sequence[dict[str, torch.Tensor]]) -> float | None:
    """The median pairwise cosine between the parties' flattened weight matrices
    (:func:`matrix_weights`; None when fewer than 2 or their layouts differ)."""
    if len(states) < 2 or not same_layout(states):
        return None
    if len(states) > COSINE_SAMPLE:  # a seeded subset: the median needs no K × K matrix
        pick = np.random.default_rng(0).choice(len(states), COSINE_SAMPLE, replace=False)
        states = [states[i] for i in sorted(pick)]
    flat = torch.nn.functional.normalize(
        torch.stack([flat_weights(matrix_weights(s)) for s in states]), dim=1)
    cos = (flat @ flat.T).numpy()
    return float(np.median(cos[np.triu_indices(len(states), 1)]))


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def assess_basin(cosine: float | None, local_logits: np.ndarray,
                 average_logits: np.ndarray | None) -> Basin:
    """The :class:`Basin` of K parties from the cosine of their weights
    (:func:`weight_cosine`; None: not comparable), their target logits (K, M, C), and the
    parameter average's target logits (M, C) (None: no average)."""
    probs = _softmax(np.asarray(local_logits))
    ensemble = probs.mean(0).argmax(1)
    agree = (probs.argmax(2) == ensemble[None]).mean(1)
    best = int(np.argmax(agree))
    avg = None if average_logits is None else \
        float((np.asarray(average_logits).argmax(1) == ensemble).mean())
    return Basin(cosine, avg, float(np.median(agree)), best, float(agree[best]),
                 [float(a) for a in agree])


def start_line(received) -> str | None:
    """Before any work, from the weights alone: the line to say when the newest round's
    parties (mrtf.trust.selection) trained from their own starts, else None (whether their
    average agrees with the ensemble needs the target and is said by refine)."""
    states = [m.state_dict for m in select(received).locals_]
    cos = weight_cosine(states)
    if cos is None or cos >= SHARED_COSINE:
        return None
    return (f"parties trained from their own starts (median weight cosine {cos:.2f}): their "
            "parameter average is no model; with the trust checks on (the default) the "
            "student starts from the party that agrees most with the ensemble")
