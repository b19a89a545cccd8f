"""The pipeline's last stage: the labels (the refined model's neighbour vote, its softmax, or
θ_{t+1}'s without teachers), their calibration, and :class:`RefineResult` with ``info``."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from torch import nn

from mrtf.errors import InputError
from mrtf.refinery.neighbour_vote import final_probs
from mrtf.refinery.state import RefineState
from mrtf.refinery.trusted import adaptive_info, calibrated


@dataclass
class RefineResult:
    """model: refined module (eval mode, on the CPU). probs (M, C): the labels' probabilities:
    its softmax on the target, or (adaptive) its neighbour vote (``model_probs``: its own).
    target_probs (M, C): distillation targets (fedavg: θ_{t+1}'s probs; adaptive: the
    consensus, kept for the record when θ_{t+1} was adapted to the target instead, novelty.py).
    averaged_probs (M, C): θ_{t+1} (or the student) before refinement. info: method, variant,
    u_t, teachers, heterogeneous, notes, config (adaptive: also sources, trust, novelty).
    timings: seconds per stage."""

    model: nn.Module
    probs: np.ndarray
    target_probs: np.ndarray
    averaged_probs: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    #: calibrated confidence of the labels and the label-free accuracy estimate
    #: (mrtf.trust.calibration.Calibration); None only if it could not be computed
    calibration: Any = None
    #: the refined model's own softmax (M, C) when ``probs`` are its neighbour vote
    #: (neighbour_vote.py, the adaptive default); None when ``probs`` are the model's own
    model_probs: np.ndarray | None = None


def accuracy_of(probs: np.ndarray, y: np.ndarray) -> float:
    """Per-sample accuracy of argmax(probs (M, C)) against y (M,); for scoring only."""
    y = np.asarray(y).reshape(-1)
    if len(y) != len(probs):
        raise InputError(f"{len(probs)} predictions but {len(y)} labels")
    return float((np.asarray(probs).argmax(1) == y).mean())


def report(state: RefineState) -> RefineResult:
    """The labels and ``info``: the adaptive method's account, the vote-or-adapt choice, the
    vote, the calibration (timed) and the party reliability."""
    config, plan, timings = state.config, state.plan, state.timings
    assert plan is not None and state.model is not None and state.before is not None
    before = state.before
    t0 = time.perf_counter()
    # θ_{t+1} as it is (fedavg): `before` is its softmax; an adapted one (shot, aad) is predicted
    unchanged = not state.taught and state.model is state.self_model
    probs, vote = (before, None) if unchanged else \
        final_probs(state.model, state.source, config.vote_k, config.inference_batch,
                    state.dev, config.stack)
    timings["predict"] = time.perf_counter() - t0
    info = {"method": config.method, "variant": config.variant, "u_t": state.u,
            "teachers": len(plan.locals_), "heterogeneous": plan.heterogeneous,
            "notes": state.notes, "config": asdict(config)} | \
        ({"streaming": True} if state.spilled else {})
    if vote is not None:
        info["neighbour_vote"] = vote.info()
    if state.adaptive is not None:
        info.update(adaptive_info(state.adaptive, probs, before))
    if state.novelty is not None:
        info["novelty"] = {**asdict(state.novelty), "line": state.novelty.line()}
    t0 = time.perf_counter()
    cal, entries = calibrated(probs, before, state.signals, info.get("estimated_accuracy"))
    info.update(entries)
    timings["calibration"] += time.perf_counter() - t0
    if state.trusted is not None:
        info.update(state.trusted.info(config.aggregate))
    targets = state.targets if state.targets is not None else before
    return RefineResult(state.model.eval().cpu(), probs, targets, before, info, timings, cal,
                        None if vote is None else vote.probs)
