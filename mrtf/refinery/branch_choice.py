"""Vote or adapt, the adaptive default's step 5: which way to the refined model.

**Vote**: the student distilled to the parties' consensus, right when the parties' errors
differ, so that a vote corrects them. **Adapt**: θ_{t+1}, the parameter average, adapted to
the target with SHOT (Liang et al. 2020) and settled, right when the target is new to every
party, so that their errors agree and a vote would confirm them (novelty.py), and when there
is one party only: one annotator's errors cannot be outvoted, and its consensus with θ_{t+1}
(the same model) and the clusters repeats them. One source model is SHOT's own setting: on
USPS → MNIST (SHOT's source recipe, seeds 0-2) the vote gave 0.918 where SHOT gave 0.980,
and the loss-gap reading missed it (gap 0.12-0.19 nats: parties trained with label smoothing
report a training loss high by construction; docs/benchmarks/standard-digits.md; the
BatchNorm feature shift, novelty.py, reads 0.35-0.38 there).

Tried and left out: running both branches and keeping the labels that follow the target's
neighbourhoods (in its input space) better than chance by more, as prior_choice.py does for
the class prior. On one-shot Dirichlet-0.1 parties (bench/label_quality.py, seed 0) it kept
the adapted labels on an excess of 0.717 against 0.706, accuracy 0.763 against the vote's
0.951: pixel-space neighbourhoods are too coarse to tell two fair labelings apart.

**A start SHOT can adapt from.** SHOT's first centroids are the start's own labels (SHOT
Eq. 4-6), so a θ_{t+1} that puts the target into a few classes stays there. Ten one-shot
Dirichlet-0.1 parties of plain LeNets (the project's recipe, MNIST → USPS) average to such a
model: its labels' histogram had 0.00-0.32 of the entropy of an even one, the loss gap
(0.30-0.54) said "new", and the adapted labels were 0.132-0.350 right where the vote gave
0.904-0.911. Where θ_{t+1} is the only start (a plain network, or one party: fit.py), its
labels must spread over the classes (:data:`MIN_START_DIVERSITY`) for the branch to adapt;
else the vote is distilled. Networks with BatchNorm and several parties are adapted from the
vote's student too (adapt_start.py), which is the remedy there.

**An adaptation that empties classes.** A start can spread its labels and SHOT still merge
classes: ten such parties on MNIST → USPS (Dirichlet 0.1, seed 6; θ_{t+1}'s spread 0.47, just
over the start guard) adapted to labels in six classes, 0.495 right, where the vote gave 0.929.
So the adapted labels must spread over the classes nearly as far as the parties' consensus
does (:data:`MAX_SPREAD_LOSS`), else the vote is distilled. This was found where θ_{t+1} was
the only start; where both starts are adapted (adapt_start.py) the kept one is checked the
same way, and the vote's student, as distilled before SHOT, is what the vote gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from mrtf.refinery.adapt_start import StartChoice
from mrtf.refinery.debias import label_counts, label_diversity
from mrtf.refinery.novelty import Novelty
from mrtf.trust.class_frequencies import spread_against

#: the reason of labels from the vote's student adapted (:func:`adapted_vote`)
VOTE_THEN_ADAPTED = "vote, then adapted"
REASONS = ("novelty", "one party", "vote", "collapsed start", "collapsed adaptation",
           VOTE_THEN_ADAPTED)
#: the entropy of θ_{t+1}'s label histogram, as a share of ln C, under which it is no start
#: for SHOT (module docstring): adapted sets of the label-quality grid and the fresh sets
#: 0.57-0.99, the collapsed averages above 0.00-0.32 (chosen between them, in-sample)
MIN_START_DIVERSITY = 0.45
#: how much less spread (a share of ln C, :func:`label_diversity`) the adapted labels may have
#: than the consensus' before the vote is distilled instead: collapsed adaptations lost
#: 0.10-0.24 (new seeds of the grid's digits → mnist5k / mnistm5k, MNIST → MNIST-M and
#: MNIST → USPS with ten parties: 0.21-0.50 right, the consensus 0.22-0.91); adaptations that
#: kept every class lost at most 0.05 (chosen between them, in-sample;
#: docs/benchmarks/standard-digits.md, "An adaptation that empties classes")
MAX_SPREAD_LOSS = 0.08


@dataclass(frozen=True)
class BranchChoice:
    """``chosen``: 'vote' or 'adapt'; ``by``: why: 'novelty' (the parties' novelty signal),
    'one party' (a single local model: nothing to vote over) or 'vote' (neither); ``start``:
    where the adapt branch started (adapt_start.py; None before the fit, on the vote branch,
    and with one party); ``start_diversity``: θ_{t+1}'s label diversity where it would be the
    only start (:func:`label_diversity`; None where it was not read), and 'collapsed start'
    the reason to vote when it is under :data:`MIN_START_DIVERSITY`."""

    chosen: str
    by: str
    start: StartChoice | None = None
    start_diversity: float | None = None
    #: (the adapted labels', the consensus') diversity where the adaptation was checked
    #: (:func:`collapsed_adaptation`), else None
    spreads: tuple[float, float] | None = None

    @property
    def adapts(self) -> bool:
        """Whether θ_{t+1} is adapted (not the vote distilled)."""
        return self.chosen == "adapt"

    def line(self) -> str:
        why = {"novelty": "the target is new to the parties (target novelty, above)",
               "one party": "one party only: its errors cannot be outvoted",
               "vote": "more than one party, and the target is not new to them",
               "collapsed start": (
                   f"adapting θ_{{t+1}} was called for, but its labels' spread is "
                   f"{self.start_diversity or 0.0:.2f} of an even one's (under "
                   f"{MIN_START_DIVERSITY}): SHOT starts from those labels and would keep "
                   f"them"),
               "collapsed adaptation": (
                   "adapted, the labels' spread fell to "
                   f"{(self.spreads or (0.0, 0.0))[0]:.2f} of an even one's against the "
                   f"parties' consensus' {(self.spreads or (0.0, 0.0))[1]:.2f}: SHOT merged "
                   "classes, and the vote was distilled instead"),
               VOTE_THEN_ADAPTED: (
                   "the parties' vote was distilled, then its student adapted to the target "
                   "with SHOT and settled (option adapt_vote)")}[self.by]
        start = "" if self.start is None else f"; {self.start.line()}"
        return f"vote or adapt: {self.chosen} ({why}){start}"

    def to_dict(self) -> dict:
        return {"chosen": self.chosen, "by": self.by, "line": self.line(),
                "start": None if self.start is None else self.start.to_dict(),
                "start_diversity": self.start_diversity,
                "spreads": None if self.spreads is None else list(self.spreads)}


def choose_branch(novelty: Novelty | None, num_local: int,
                  start_diversity: float | None = None) -> BranchChoice | None:
    """Adapt when the novelty signal says so or when there is one local model, unless θ_{t+1}
    would be the only start and its labels are collapsed (``start_diversity`` under
    :data:`MIN_START_DIVERSITY`; None: not read); None when there is nothing to adapt (no
    novelty reading: no θ_{t+1}, or a student was given)."""
    if novelty is None:
        return None
    by = "novelty" if novelty.adapt else "one party" if num_local == 1 else None
    if by is None:
        return BranchChoice("vote", "vote", start_diversity=start_diversity)
    if start_diversity is not None and start_diversity < MIN_START_DIVERSITY:
        return BranchChoice("vote", "collapsed start", start_diversity=start_diversity)
    return BranchChoice("adapt", by, start_diversity=start_diversity)


def spread_of(probs: np.ndarray, prior: Sequence[float] | None = None) -> float:
    """How far the labels argmax(probs) (M, C) spread over the classes, as a share of ln C:
    :func:`label_diversity` (against an even spread), or against the class shares ``prior``
    (mrtf.trust.class_frequencies.spread_against)."""
    if prior is None:
        return label_diversity(probs)
    counts = label_counts(probs)
    return spread_against(counts / max(1, len(probs)), np.asarray(prior, dtype=np.float64))


def adapted_vote(branch: BranchChoice) -> BranchChoice:
    """``branch`` (a vote) followed by the vote's student adapted: the labels come from an
    adapted model, read as voted labels with the ± reaching down to the vote's
    (mrtf.trust.midpoint_estimate.down_to_the_vote)."""
    return BranchChoice("adapt", VOTE_THEN_ADAPTED, None, branch.start_diversity)


def collapsed_adaptation(branch: BranchChoice, adapted: np.ndarray, consensus: np.ndarray,
                         prior: Sequence[float] | None = None) -> BranchChoice:
    """``branch`` (an adapt) checked against what the adaptation gave: the vote, by
    'collapsed adaptation', when the ``adapted`` labels' diversity (M, C probabilities) is
    under the ``consensus``' by more than :data:`MAX_SPREAD_LOSS`; else ``branch`` with the two
    spreads recorded. With the target's class shares ``prior`` (given by the user) both
    spreads are read against them, 1 − KL(h ‖ π) / ln C (:func:`spread_of`): labels that
    follow a skewed target are not a collapse."""
    spreads = (spread_of(adapted, prior), spread_of(consensus, prior))
    if spreads[0] < spreads[1] - MAX_SPREAD_LOSS:
        return BranchChoice("vote", "collapsed adaptation", None, branch.start_diversity,
                            spreads)
    return replace(branch, spreads=spreads)
