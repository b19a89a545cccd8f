"""What the refine pipeline's stages pass on (pipeline.py): the plan of who teaches and who
learns, then each stage's outputs, in one typed object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from mrtf.refinery.adaptive import AdaptiveTargets
from mrtf.refinery.branch_choice import BranchChoice
from mrtf.refinery.config import RefineConfig
from mrtf.refinery.novelty import Novelty
from mrtf.refinery.registry import Method


@dataclass
class Plan:
    """Who teaches and who learns, before any heavy work (plan.py)."""

    locals_: list[nn.Module]
    start: nn.Module | None  # θ_t
    agg: nn.Module | None  # θ_{t+1}
    student: nn.Module  # starts distillation (θ_{t+1} copy or the given student)
    heterogeneous: bool
    notes: list[str]
    names: list[str]  # the local models' party names, then θ_t's and θ_{t+1}'s
    locals_received: list = field(default_factory=list)  # S_t (ReceivedModel)
    start_received: Any = None  # θ_t (ReceivedModel) or None


def _stage_timings() -> dict[str, float]:
    return {"teachers": 0.0, "clr": 0.0, "distill": 0.0, "predict": 0.0, "calibration": 0.0}


@dataclass
class RefineState:
    """One refinement as it goes through the stages. The inputs first; every later field is
    None (or empty) until the stage that makes it has run.

    used : the received local models whose claims count (train loss for u_t and novelty).
    logits : the teachers' logits, storage.MemoryLogits or SpilledLogits: ``logits.view`` is
        (K, M, C), an array or a spill read as one; the adaptive method writes its
        stabilized softmax over them.
    features : θ_{t+1}'s features (M, D) when the method keeps them.
    before : θ_{t+1}'s (or the student's) softmax (M, C) before refinement.
    factors : each teacher's consensus factor from the party checks (None: all 1).
    neighbours : the target's own neighbourhoods (M, k) (mrtf.trust.neighbours).
    signals : the calibration's evidence (mrtf.trust.calibration.Signals).
    start_model : the model the fit starts from. model : the refined model.
    labels : the refined model's labels (neighbour_vote.final_probs) when the fit already
        computed them (the adapt branch from both starts); else the report computes them.
    branch : the adaptive default's vote-or-adapt choice (branch_choice.py).
    vote_probs : the vote's student's labels before SHOT where the fit adapted it (option
        adapt_vote), which the estimate reads too (trusted.calibrated); else None.
    input_reading : how the target is read (input_reading.ReadingChoice; None: as given, not
        searched). ``source`` is then the target read that way.
    """

    received: Any
    source: Any
    config: RefineConfig
    method: Method
    dev: torch.device
    student_given: bool
    plan: Plan | None = None
    timings: dict[str, float] = field(default_factory=_stage_timings)
    trusted: Any = None  # trusted.Trusted
    used: list = field(default_factory=list)
    u: float | None = None
    notes: list[str] = field(default_factory=list)
    teachers: list[nn.Module] = field(default_factory=list)
    storage: Any = None  # storage.MemoryStorage or storage.SpilledStorage
    logits: Any = None
    features: Any = None
    before: np.ndarray | None = None
    factors: list[float] | None = None
    neighbours: np.ndarray | None = None
    signals: Any = None
    novelty: Novelty | None = None
    branch: BranchChoice | None = None  # the adaptive default's vote-or-adapt choice
    input_reading: Any = None  # input_reading.ReadingChoice
    targets: np.ndarray | None = None
    adaptive: AdaptiveTargets | None = None
    start_model: nn.Module | None = None
    model: nn.Module | None = None
    labels: tuple[np.ndarray, Any] | None = None
    vote_probs: np.ndarray | None = None

    @property
    def self_model(self) -> nn.Module:
        """θ_{t+1}, or the student when there is no parameter average."""
        assert self.plan is not None
        return self.plan.agg if self.plan.agg is not None else self.plan.student

    @property
    def num_local(self) -> int:
        assert self.plan is not None
        return len(self.plan.locals_)

    @property
    def taught(self) -> bool:
        return bool(self.teachers)

    @property
    def spilled(self) -> bool:
        return bool(self.storage is not None and self.storage.spilled)
