"""Vote or adapt, the adaptive default's step 5, decided on the target's own neighbourhoods.

Two ways to a refined model exist. **Vote**: the student distilled to the parties' consensus
(right when the parties' errors differ, so a vote corrects them). **Adapt**: θ_{t+1}, the
parameter average, adapted to the target with SHOT (Liang et al. 2020) and settled (right
when the target is new to every party, so their errors agree and a vote would confirm them).

The parties' novelty signal (novelty.py: their entropy on the target against the training
loss they report) is a sufficient reason to adapt, but it misses: parties trained with label
smoothing (SHOT's own source recipe) report a training loss that is high by construction, so
a target new to them looks familiar. On the standard digits (USPS → MNIST, one source model,
SHOT's source recipe) the gap was 0.12-0.19 nats, under the 0.3 threshold, and the vote gave
0.918 where adapting gave 0.98 (docs/benchmarks/standard-digits.md).

So when the novelty signal does not decide, both branches run and the labels that follow the
target's natural clusters better than chance by more are kept: the share of each sample's
nearest target samples (in the target's own input space, mrtf.trust.neighbours: the data
only, no model's features) that carry its label, less the share two random samples would
(prior_choice.py's rule for the class prior, reused). Adapting must be strictly better; a tie
keeps the vote, the behaviour before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mrtf.refinery.prior_choice import chance_agreement, neighbour_agreement

BRANCHES = ("vote", "adapt")


@dataclass(frozen=True)
class BranchChoice:
    """The branch kept (``chosen``: 'vote' or 'adapt') and why: ``by`` is 'novelty' (the
    parties' novelty signal alone decided, one branch ran) or 'neighbours' (both ran; per
    branch, ``agreement`` with the target neighbours' labels, ``chance`` = Σ h_c², and
    ``excess`` = agreement - chance, higher kept)."""

    chosen: str
    by: str
    agreement: dict[str, float] = field(default_factory=dict)
    chance: dict[str, float] = field(default_factory=dict)
    excess: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        if self.by == "novelty":
            return "vote or adapt: adapt (the parties' novelty signal decided; see above)"
        parts = [f"{b} {self.agreement[b]:.3f} ({self.chance[b]:.3f} by chance)"
                 for b in BRANCHES if b in self.agreement]
        return (f"vote or adapt: {self.chosen} (labels agreeing with their target "
                f"neighbours: {', '.join(parts)})")

    def to_dict(self) -> dict:
        return {"chosen": self.chosen, "by": self.by, "agreement": dict(self.agreement),
                "chance": dict(self.chance), "excess": dict(self.excess),
                "line": self.line()}


def choose_branch(vote: np.ndarray, adapt: np.ndarray, neighbours: np.ndarray
                  ) -> BranchChoice:
    """The branch whose labels (M,) follow the target's neighbourhoods (M, k) better than
    chance by more; adapt only when strictly better."""
    labels = {"vote": np.asarray(vote), "adapt": np.asarray(adapt)}
    agree = {b: neighbour_agreement(v, neighbours) for b, v in labels.items()}
    chance = {b: chance_agreement(v) for b, v in labels.items()}
    excess = {b: agree[b] - chance[b] for b in labels}
    chosen = "adapt" if excess["adapt"] > excess["vote"] else "vote"
    return BranchChoice(chosen, "neighbours", agree, chance, excess)
