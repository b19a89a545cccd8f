"""The pipeline's last stage: the labels (the refined model's neighbour vote, its softmax, or
θ_{t+1}'s without teachers), their calibration, and :class:`RefineResult` with the run's
account (result.py)."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from mrtf.errors import InputError
from mrtf.refinery.neighbour_vote import final_probs
from mrtf.refinery.result import RefineResult
from mrtf.refinery.state import RefineState
from mrtf.refinery.trusted import calibrated, consensus_account, consensus_view


def accuracy_of(probs: np.ndarray, y: np.ndarray) -> float:
    """Per-sample accuracy of argmax(probs (M, C)) against y (M,); for scoring only."""
    y = np.asarray(y).reshape(-1)
    if len(y) != len(probs):
        raise InputError(f"{len(probs)} predictions but {len(y)} labels")
    return float((np.asarray(probs).argmax(1) == y).mean())


def report(state: RefineState) -> RefineResult:
    """The labels and the run's account: the adaptive method's, the vote-or-adapt choice,
    the vote, the calibration (timed) and the party reliability."""
    config, plan, timings = state.config, state.plan, state.timings
    assert plan is not None and state.model is not None and state.before is not None
    before = state.before
    t0 = time.perf_counter()
    # θ_{t+1} as it is (fedavg): `before` is its softmax; an adapted one (shot, aad) is predicted
    unchanged = not state.taught and state.model is state.self_model
    if state.labels is not None:
        probs, vote = state.labels
    elif unchanged:
        probs, vote = before, None
    else:
        probs, vote = final_probs(state.model, state.source, config.vote_k,
                                  config.inference_batch, state.dev, config.stack)
    timings["predict"] = time.perf_counter() - t0
    view = None if state.adaptive is None else consensus_view(state.adaptive, probs, before)
    if state.adaptive is not None:
        # its (M, C) float64 posterior is read no more (the account reads the sources): freed
        # before the calibration's arrays, where a refine on CUDA peaks (docs/gpu.md)
        state.adaptive = replace(state.adaptive, consensus=None)
    t0 = time.perf_counter()
    adapted = state.branch is not None and state.branch.adapts
    cal, accuracy = calibrated(probs, before, state.signals, view, state.dev, adapted,
                               state.vote_probs)
    timings["calibration"] += time.perf_counter() - t0
    targets = state.targets if state.targets is not None else before
    return RefineResult(
        state.model.eval().cpu(), probs, targets, before, config, accuracy, timings, cal,
        None if vote is None else vote.probs, u_t=state.u, teachers=len(plan.locals_),
        heterogeneous=plan.heterogeneous, notes=state.notes, streaming=state.spilled,
        neighbour_vote=None if vote is None else vote.summary(),
        consensus=None if state.adaptive is None else consensus_account(state.adaptive),
        novelty=state.novelty,
        parties=None if state.trusted is None else state.trusted.checks(config.aggregate),
        branch=state.branch, input_reading=state.input_reading)
