"""What ``refine`` returns: :class:`RefineResult`, the labels and the refined model with the
run's account as typed, documented records (each with ``to_dict()``, the form ``mrtf refine
--json``, the labels file and ``bench/`` write), built by report.py."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from torch import nn

from mrtf.io.reading import Reading
from mrtf.refinery.adaptive import SourceTrust
from mrtf.refinery.branch_choice import BranchChoice
from mrtf.refinery.config import RefineConfig
from mrtf.refinery.neighbour_vote import NeighbourVoteSummary
from mrtf.refinery.novelty import Novelty
from mrtf.refinery.prior_choice import PriorChoice
from mrtf.trust.calibration import Calibration
from mrtf.trust.reliability import PartyReliability


@dataclass(frozen=True)
class ClassPriorUsed:
    """The class prior the adaptive consensus assumed ("learned", "uniform" or "given": the
    class frequencies the user gave) and the line ``refine`` says about it. choice: the
    comparison that kept it (class_prior "auto", prior_choice.py); None when the prior was
    given (uniform, or the frequencies; each model's class bias divided out)."""

    chosen: str
    line: str
    choice: PriorChoice | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.choice is None:
            return {"chosen": self.chosen, "agreement": None, "line": self.line}
        return {**asdict(self.choice), "line": self.line}


@dataclass(frozen=True)
class ConsensusAccount:
    """The adaptive method's account of its consensus (adaptive.py): each source's weight and
    why (the cluster view last), the consensus' mean max posterior, the cluster view's
    weight, the strength of the class-bias correction (0..1) and the class prior (None: the
    learned prior, nothing chosen)."""

    sources: tuple[SourceTrust, ...]
    consensus_confidence: float
    cluster_weight: float
    debias_strength: float
    class_prior: ClassPriorUsed | None = None

    @property
    def trust(self) -> list[str]:
        """One line per source, as ``refine`` prints them."""
        return [t.line() for t in self.sources]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sources": [asdict(t) for t in self.sources],
                               "trust": self.trust,
                               "consensus_confidence": self.consensus_confidence,
                               "cluster_weight": self.cluster_weight,
                               "debias_strength": self.debias_strength}
        if self.class_prior is not None:
            out["class_prior"] = self.class_prior.to_dict()
        return out


@dataclass(frozen=True)
class ConsensusView:
    """The adaptive consensus' own estimate of the accuracy of the refined labels and of
    θ_{t+1}'s (its posterior's agreement; optimistic where the models are weak)."""

    refined: float
    averaged: float


@dataclass(frozen=True)
class AccuracyEstimate:
    """The label-free estimate of the labels' accuracy (mrtf.trust.calibration): ``refined``
    ± ``plus_minus`` by ``method``; ``averaged``: θ_{t+1}'s before refinement (None without
    teachers); ``consensus_view``: the adaptive consensus' own view (None otherwise);
    ``reading``: which rule printed the estimate (mrtf.trust.midpoint_estimate.READINGS)."""

    refined: float
    plus_minus: float
    method: str
    averaged: float | None = None
    consensus_view: ConsensusView | None = None
    reading: str = "calibrator"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BasinVerdict:
    """Whether the parties share a basin (mrtf.trust.basin) and what refine did about it:
    the median cosine of their weights, the parameter average's and the median party's
    agreement with the ensemble, whether they share a start and whether the average was
    used; ``line`` is what ``refine`` says."""

    line: str | None
    cosine: float | None
    average_agreement: float | None
    party_agreement: float | None
    shared_start: bool
    average_used: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PartyChecks:
    """The trust layer's verdicts on the local models (``RefineConfig.trust_on``): one
    PartyReliability per party, the aggregate θ_{t+1} was rebuilt with, how many target
    samples they were measured on (None: all) and the basin check (None: not judged)."""

    parties: tuple[PartyReliability, ...]
    aggregate: str
    samples: int | None = None
    basin: BasinVerdict | None = None

    @property
    def verdicts(self) -> list[str]:
        """One line per party: its verdict and why."""
        return [p.line() for p in self.parties]

    def verdict_of(self) -> dict[str, str]:
        """Party name → 'trusted' | 'down-weighted' | 'excluded'."""
        return {p.name: p.verdict for p in self.parties}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reliability": [p.to_dict() for p in self.parties],
                               "verdicts": self.verdicts, "aggregate": self.aggregate}
        if self.samples is not None:
            out["reliability_samples"] = self.samples
        if self.basin is not None:
            out["basin"] = self.basin.to_dict()
        return out


@dataclass
class RefineResult:
    """What ``refine`` returns.

    model: the refined module (eval mode, on the CPU).
    probs (M, C): the labels' probabilities: its softmax on the target, or (adaptive) its
    neighbour vote (``model_probs``: its own softmax).
    target_probs (M, C): the distillation targets (fedavg: θ_{t+1}'s probs; adaptive: the
    consensus, kept for the record when θ_{t+1} was adapted to the target instead).
    averaged_probs (M, C): θ_{t+1}'s (or the student's) before refinement.
    timings: seconds per stage (teachers, clr, distill, predict, calibration).
    calibration: the labels' calibrated confidence (mrtf.trust.calibration.Calibration).
    model_probs (M, C): the refined model's own softmax when ``probs`` are its neighbour
    vote; None when ``probs`` are the model's own.
    config: the settings the run used (streaming or not decided).
    u_t: the uncertainty weight u_t of Eq. 10 (None when the method does not use it).
    teachers: how many local models taught. heterogeneous: whether their architectures
    differ (no parameter average). notes: what the refinery did that a user should know.
    streaming: whether the teachers' outputs were spilled to disk (refine --stream).
    accuracy: the label-free accuracy estimate. neighbour_vote: the vote's summary (None:
    the labels are the model's own). consensus: the adaptive method's account (None for
    the other methods). novelty: the parties' novelty signal (novelty.py; None for the
    others). branch: the adaptive method's vote-or-adapt choice and why (branch_choice.py;
    None for the others). parties: the trust layer's verdicts (None when it was off).
    input_reading: how the target's images were read and why (input_reading.ReadingChoice;
    None: as given, no search ran).
    """

    model: nn.Module
    probs: np.ndarray
    target_probs: np.ndarray
    averaged_probs: np.ndarray
    config: RefineConfig
    accuracy: AccuracyEstimate
    timings: dict[str, float] = field(default_factory=dict)
    calibration: Calibration | None = None
    model_probs: np.ndarray | None = None
    u_t: float | None = None
    teachers: int = 0
    heterogeneous: bool = False
    notes: list[str] = field(default_factory=list)
    streaming: bool = False
    neighbour_vote: NeighbourVoteSummary | None = None
    consensus: ConsensusAccount | None = None
    novelty: Novelty | None = None
    parties: PartyChecks | None = None
    branch: BranchChoice | None = None
    input_reading: Any = None

    @property
    def reading(self) -> Reading:
        """How the target's images were read (``Reading()``: as given)."""
        return Reading() if self.input_reading is None else self.input_reading.reading

    def run_config(self) -> dict[str, Any]:
        """The settings the run used with its u_t, as the labels file and the refined model's
        metadata record them."""
        return {**asdict(self.config), "u_t": self.u_t}

    def to_dict(self) -> dict[str, Any]:
        """The run's account in plain JSON-able types (no arrays, no model), with the keys
        of ``mrtf refine --json``: method, variant, u_t, teachers, heterogeneous, notes,
        config, streaming (only when true), neighbour_vote, the consensus' (sources, trust,
        consensus_confidence, cluster_weight, debias_strength, class_prior), novelty, branch,
        input_reading, estimated_accuracy, calibration, the parties' (reliability, verdicts,
        aggregate, reliability_samples, basin); a group's keys only where it exists."""
        out: dict[str, Any] = {"method": self.config.method, "variant": self.config.variant,
                               "u_t": self.u_t, "teachers": self.teachers,
                               "heterogeneous": self.heterogeneous, "notes": self.notes,
                               "config": asdict(self.config)}
        if self.streaming:
            out["streaming"] = True
        if self.neighbour_vote is not None:
            out["neighbour_vote"] = self.neighbour_vote.to_dict()
        if self.consensus is not None:
            out |= self.consensus.to_dict()
            if self.accuracy.consensus_view is not None:  # its place among the consensus'
                out["estimated_accuracy"] = None
        if self.novelty is not None:
            out["novelty"] = self.novelty.to_dict()
        if self.branch is not None:
            out["branch"] = self.branch.to_dict()
        if self.input_reading is not None:
            out["input_reading"] = self.input_reading.to_dict()
        out["estimated_accuracy"] = self.accuracy.to_dict()
        out["calibration"] = None if self.calibration is None else self.calibration.attrs()
        if self.parties is not None:
            out |= self.parties.to_dict()
        return out
