"""Which class prior the adaptive consensus assumes (``class_prior="auto"``, the default),
chosen from the target's own neighbourhoods.

The consensus can learn the target's class frequencies from the votes ("learned") or divide
each model's class bias out first ("uniform", adaptive.debias). The models' outputs cannot
tell the two cases apart: a model moved to another domain and a target that really holds
few classes both make it name a few classes too often. The target's inputs can: labels that
are right follow the target's natural clusters, so of the two labelings the one whose labels
agree more often with their nearest target samples (in the target's own input space,
mrtf.trust.neighbours, the data only) is kept. Uniform must do strictly better; a tie, or no
neighbourhoods (fewer than 2 samples), keeps the learned prior.

Measured (y only scores; seeds 0-2 of every cell):

- the consensus targets before distillation (``bench/class_prior.py``; the skewed targets keep
  class c with probability 0.6^c): on the label-quality grid (24 sets) balanced learned 0.627,
  uniform 0.652, auto 0.645; skewed 0.699, 0.648, 0.707. On 27 sets never used to choose the
  rule (``--out runs/fresh --all-cached``, the fresh cells of bench/calibration_fresh.py)
  balanced 0.489, 0.504, 0.503; skewed 0.500, 0.500, 0.501.
- the refined labels (``bench/label_quality.py``, grid): learned 0.635, uniform 0.656, auto
  0.650; auto was better than learned in 9 of 26 sets (up to +12.2 points), worse in 4
  (down to -4.2: one-shot label:2 seed 1) and equal in 13.

The rule (pixel-space neighbourhoods, no margin) was picked on the grid's targets among 8
variants (neighbours in the input or in θ_{t+1}'s feature space, raw or chance-corrected,
either or both) before the 27 fresh sets were scored, so the grid numbers are in-sample.

Where the neighbourhoods cannot see the classes (mnist5k → mnistm5k: coloured backgrounds in
pixel space) the two labelings score alike and the choice is close to a coin; there the prior
matters least (≤ 2 points), and the default adapts θ_{t+1} instead of distilling the vote.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mrtf.trust.neighbours import label_consistency

#: what the consensus may assume of the target's class frequencies; "auto" (the default)
#: picks one of the other two per target (``choose_prior``)
CLASS_PRIORS = ("auto", "learned", "uniform")


@dataclass
class PriorChoice:
    """The class prior kept (``chosen``) and, per candidate prior, the share of the labels'
    target neighbours that carry the same label (``agreement``: higher is kept)."""

    chosen: str
    agreement: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        other = "learned" if self.chosen == "uniform" else "uniform"
        return (f"class prior: {self.chosen} (chosen: its labels agree with "
                f"{self.agreement[self.chosen]:.3f} of their target neighbours, "
                f"{other} {self.agreement[other]:.3f})")


def neighbour_agreement(labels: np.ndarray, neighbours: np.ndarray) -> float:
    """Mean share of each sample's target neighbours (M, k) that carry its label (M,)."""
    return float(label_consistency(np.asarray(labels), neighbours).mean())


def choose_prior(learned: np.ndarray, uniform: np.ndarray, neighbours: np.ndarray
                 ) -> PriorChoice:
    """The prior whose labels (M,) follow the target's neighbourhoods better; uniform only
    when strictly better (a tie keeps the consensus' own, learned, prior)."""
    agree = {"learned": neighbour_agreement(learned, neighbours),
             "uniform": neighbour_agreement(uniform, neighbours)}
    return PriorChoice("uniform" if agree["uniform"] > agree["learned"] else "learned", agree)
