"""adaptive, the default: every source weighted by what the target set says about it, then a
neighbour vote. Its steps, as README "How adaptive works" numbers them, and where each runs:

1. sources: every source's stabilized softmax (Eq. 6), written over the logits; dead sources
   left out                                       (:meth:`Adaptive.targets`, votes.py)
2. consensus: Dawid-Skene over the sources, θ_t and θ_{t+1} 0.75 each, from the local
   models' AvgProb                                (refinery/adaptive.py, consensus.py)
3. clusters: k-means of θ_{t+1}'s features as one more annotator, weight λ
                                                  (refinery/adaptive.py, cluster.py)
4. class prior: the consensus under both priors, the one the target's neighbourhoods
   follow better kept                             (prior_choice.py)
5. vote or adapt: a target new to the parties (their novelty signal: loss claims, and
   BatchNorm statistics where the models have them), or one party only
   → θ_{t+1} adapted with SHOT and settled, and (BatchNorm, several parties) also the vote's
   student; the labels with more information, no less spread, kept; the vote instead if
   the adapted labels spread less than the consensus; with the option adapt_vote
   (:class:`AdaptiveSettings`), the vote's student is then adapted and settled too
                                                 (:meth:`Adaptive.evidence`, novelty.py,
                                                  feature_shift.py, adapt_start.py,
                                                  :meth:`Adaptive.fit`, branch_choice.py,
                                                  fit.py, shot.py)
6. distil: the student (θ_{t+1}, or θ_t when θ_{t+1} is dead) distilled to the consensus with
   its inputs jittered                            (:meth:`Adaptive.fit`, fit.py, augment.py)
7. neighbour vote: each label the refined model's softmax summed over its 3 nearest target
   samples                                        (``vote``: report.py, neighbour_vote.py)
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace

import numpy as np
from torch import nn

from mrtf.refinery.adaptive import ConsensusInputs, consensus_targets, input_independent
from mrtf.refinery.branch_choice import adapted_vote, choose_branch, collapsed_adaptation
from mrtf.refinery.debias import label_diversity
from mrtf.refinery.ensemble import stabilized_blocks
from mrtf.refinery.feature_shift import feature_shift
from mrtf.refinery.fit import (
    VOTE_SCHEDULE,
    adapt_both_starts,
    adapt_student,
    adapts_from_both_starts,
    distil_student,
)
from mrtf.refinery.methods.base import Distilled
from mrtf.refinery.neighbour_vote import final_probs
from mrtf.refinery.novelty import target_novelty
from mrtf.refinery.state import RefineState
from mrtf.refinery.votes import SourceStats


@dataclass(frozen=True)
class AdaptiveSettings:
    """The default's own options (``mrtf refine --option KEY=VALUE``).

    adapt_vote : where step 5 distils the vote (several parties; also where θ_{t+1}'s own
        adaptation merged classes), the vote's student, once distilled, is adapted to the
        target with SHOT and settled, as the adapt branch adapts θ_{t+1}
        (fit.adapt_student), as fit.VOTE_SCHEDULE says (at least two rounds); kept unless its
        adaptation merged classes too (branch_choice.collapsed_adaptation). Costs one SHOT
        run and the settling rounds more per refine (docs/benchmarks/label-quality.md, "The
        option adapt_vote")."""

    adapt_vote: bool = False

    def validate(self) -> None:
        """Nothing to check: one switch."""


class Adaptive(Distilled):
    name = "adaptive"
    summary = ("consensus of every source with measured trust (adaptive.py) and a neighbour "
               "vote (neighbour_vote.py), distilled with input jitter (augment.py); the "
               "default")
    help = "every source weighted by its measured trust; the default"
    teachers = "all"
    features = True
    vote = True  # step 7
    augment = True  # step 6
    trust_default = True
    aligns_input = True  # the target read as the parties read it best (input_reading.py)
    takes_class_prior = True
    takes_class_frequencies = True  # the consensus, SHOT and the collapse check read them
    settings: AdaptiveSettings = AdaptiveSettings()

    def evidence(self, state: RefineState) -> None:
        """Step 5's choice, from the local models' entropy on the target against the losses
        they claim, and, for models with BatchNorm, the target's features against their
        running statistics (novelty.py, feature_shift.py); none without a θ_{t+1} to adapt
        (parties of different architectures, a given student)."""
        assert state.plan is not None
        if state.plan.agg is None or state.student_given:
            return
        t0 = time.perf_counter()
        shift = feature_shift(state.plan.locals_, state.source, state.dev)
        state.timings["teachers"] += time.perf_counter() - t0
        state.novelty = target_novelty(state.logits.view,
                                       [m.meta.train_loss for m in state.used],
                                       num_local=state.num_local, shift=shift,
                                       device=state.dev)
        only_start = not adapts_from_both_starts(state.plan.agg, state.num_local)
        diversity = label_diversity(state.before) \
            if only_start and state.before is not None else None
        state.branch = choose_branch(state.novelty, state.num_local, diversity)

    def choice(self, state: RefineState) -> str:
        """Step 5's reading and choice (novelty.py, branch_choice.py)."""
        if state.branch is None or state.novelty is None:
            return ("vote or adapt: the parties' vote is distilled (there is no θ_{t+1} to "
                    "adapt: a given student or no parameter average)")
        return f"{state.novelty.line()}; {state.branch.line()}"

    def targets(self, state: RefineState) -> np.ndarray:
        """Steps 1-4: Eq. 6's softmax over the logits in place (they are not read again),
        with each source's whole-M statistics (dead sources, class bias), then the
        consensus (timed as 'clr')."""
        t0 = time.perf_counter()
        config, plan = state.config, state.plan
        assert plan is not None
        k, _, c = state.logits.view.shape
        stats = SourceStats(k, c, config.class_prior in ("uniform", "auto")
                            or config.class_shares is not None, state.dev)
        # the generator reads block s+1 only after block s is written back: in place is safe
        for s, q in stabilized_blocks(state.logits.view, config, state.dev):
            stats.add(q)
            state.logits.overwrite(s, q)
        state.adaptive = consensus_targets(state.logits.source_probs(), stats, ConsensusInputs(
            plan.names, state.before, state.features, config.seed, state.num_local,
            config.class_prior, state.factors, state.neighbours, state.dev, config.class_shares))
        state.timings["clr"] = time.perf_counter() - t0
        return state.adaptive.targets

    def start_model(self, state: RefineState) -> nn.Module:
        """A dead θ_{t+1} (the same output for every sample) has zero gradients through its
        ReLUs and cannot be distilled back to life: distillation then starts from θ_t when
        there is one (a student the caller gave is kept)."""
        plan = state.plan
        assert plan is not None
        if state.student_given or plan.start is None or not input_independent(state.before):
            return plan.student
        state.notes.append("θ_{t+1} gives the same output for every sample (dead network): "
                           "distillation starts from θ_t")
        return copy.deepcopy(plan.start)

    def fit(self, state: RefineState) -> nn.Module:
        """Steps 5-6: adapted (SHOT) and settled when branch_choice.py says so (the target is
        new to the parties, or there is one party); from θ_{t+1} and from the vote's student,
        the better kept, where fit.adapts_from_both_starts says so (adapt_start.py); else
        distilled to the consensus with jitter."""
        assert state.targets is not None
        start = self.start_model(state)
        if state.branch is not None and state.branch.adapts:
            if not adapts_from_both_starts(start, state.num_local):
                return self._adapt_only_start(state, start)
            return self._adapt_both_starts(state, start)
        return self._distil_vote(state, start)

    def _distil_vote(self, state: RefineState, start: nn.Module) -> nn.Module:
        """``start`` distilled to the consensus with jitter (the vote), then adapted where
        the option adapt_vote asks (:meth:`_adapt_voted_student`)."""
        student = distil_student(start, state.source, state.targets, state.config, state.dev)
        if not self._adapts_vote(state):
            return student
        return self._adapt_voted_student(state, student)

    @staticmethod
    def _adapts_vote(state: RefineState) -> bool:
        """Whether the vote's student is adapted (:class:`AdaptiveSettings`): asked for, and
        step 5 chose the vote over several parties."""
        options = state.config.options
        return (isinstance(options, AdaptiveSettings) and options.adapt_vote
                and state.branch is not None and state.num_local > 1)

    def _adapt_voted_student(self, state: RefineState, student: nn.Module) -> nn.Module:
        """The vote's student adapted and settled (fit.adapt_student), its labels checked
        against the consensus' spread as the adapt branch's are; the student as distilled
        where the adaptation merged classes."""
        config = state.config
        assert state.branch is not None and state.targets is not None
        voted = copy.deepcopy(student)  # SHOT adapts in place
        # the vote's labels, which the estimate reads too (trusted.calibrated)
        vote_labels = final_probs(voted, state.source, config.vote_k, config.inference_batch,
                                  state.dev, config.stack)
        adapted = adapt_student(student, state.source, config, state.dev, state.spilled,
                                VOTE_SCHEDULE)
        labels = final_probs(adapted, state.source, config.vote_k, config.inference_batch,
                             state.dev, config.stack)
        state.branch = collapsed_adaptation(adapted_vote(state.branch), labels[0],
                                            state.targets, config.class_shares)
        if not state.branch.adapts:
            state.labels = vote_labels  # scored already: the report need not vote again
            return voted
        state.labels, state.vote_probs = labels, vote_labels[0]
        return adapted

    def _adapt_both_starts(self, state: RefineState, start: nn.Module) -> nn.Module:
        """θ_{t+1} and the vote's student adapted, the better kept (adapt_start.py), its labels
        checked against the consensus' spread as :meth:`_adapt_only_start` checks: the vote's
        student as distilled, before SHOT, where the kept adaptation merged classes."""
        kept = adapt_both_starts(start, state.source, state.targets, state.config, state.dev,
                                 state.spilled)
        assert state.branch is not None
        state.branch = collapsed_adaptation(replace(state.branch, start=kept.choice),
                                            kept.labels[0], state.targets,
                                            state.config.class_shares)
        if not state.branch.adapts:
            return kept.voted
        state.labels = kept.labels  # scored already: the report need not vote again
        return kept.model

    def _adapt_only_start(self, state: RefineState, start: nn.Module) -> nn.Module:
        """θ_{t+1} adapted where it is the only start, its labels checked against the
        consensus' spread (branch_choice.collapsed_adaptation): the vote's student, distilled
        from a copy of the start taken before, where the adaptation merged classes."""
        config = state.config
        before = copy.deepcopy(start)
        adapted = adapt_student(start, state.source, config, state.dev, state.spilled)
        labels = final_probs(adapted, state.source, config.vote_k, config.inference_batch,
                             state.dev, config.stack)
        state.branch = collapsed_adaptation(state.branch, labels[0], state.targets,
                                            state.config.class_shares)
        if state.branch.adapts:
            state.labels = labels  # scored already: the report need not vote again
            return adapted
        return self._distil_vote(state, before)  # adapt_vote: a second start, as BatchNorm's
