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
"""

from __future__ import annotations

from dataclasses import dataclass

from mrtf.refinery.adapt_start import StartChoice
from mrtf.refinery.novelty import Novelty

REASONS = ("novelty", "one party", "vote")


@dataclass(frozen=True)
class BranchChoice:
    """``chosen``: 'vote' or 'adapt'; ``by``: why: 'novelty' (the parties' novelty signal),
    'one party' (a single local model: nothing to vote over) or 'vote' (neither); ``start``:
    where the adapt branch started (adapt_start.py; None before the fit, on the vote branch,
    and with one party)."""

    chosen: str
    by: str
    start: StartChoice | None = None

    @property
    def adapts(self) -> bool:
        """Whether θ_{t+1} is adapted (not the vote distilled)."""
        return self.chosen == "adapt"

    def line(self) -> str:
        why = {"novelty": "the target is new to the parties (target novelty, above)",
               "one party": "one party only: its errors cannot be outvoted",
               "vote": "more than one party, and the target is not new to them"}[self.by]
        start = "" if self.start is None else f"; {self.start.line()}"
        return f"vote or adapt: {self.chosen} ({why}){start}"

    def to_dict(self) -> dict:
        return {"chosen": self.chosen, "by": self.by, "line": self.line(),
                "start": None if self.start is None else self.start.to_dict()}


def choose_branch(novelty: Novelty | None, num_local: int) -> BranchChoice | None:
    """Adapt when the novelty signal says so or when there is one local model; None when
    there is nothing to adapt (no novelty reading: no θ_{t+1}, or a student was given)."""
    if novelty is None:
        return None
    if novelty.adapt:
        return BranchChoice("adapt", "novelty")
    if num_local == 1:
        return BranchChoice("adapt", "one party")
    return BranchChoice("vote", "vote")
