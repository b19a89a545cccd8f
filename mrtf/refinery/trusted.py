"""The trust layer's hooks into refine (mrtf.trust): which parties teach and with what weight
(when ``RefineConfig.trust_on``), and how sure the labels are. Kept apart from pipeline.py so
the refinery's core reads on its own."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from mrtf.averaging import average_received
from mrtf.io.hdf5 import RowSubset
from mrtf.refinery.adaptive import estimated_accuracy
from mrtf.refinery.config import RefineConfig
from mrtf.refinery.result import (
    AccuracyEstimate,
    BasinVerdict,
    ClassPriorUsed,
    ConsensusAccount,
    ConsensusView,
    PartyChecks,
)
from mrtf.refinery.teachers import check_finite, teacher_logits
from mrtf.trust.basin import SHARED_COSINE, assess_basin, weight_cosine
from mrtf.trust.calibration import Signals, calibrate, temperature_for, uncalibrated
from mrtf.trust.class_frequencies import normalised
from mrtf.trust.confidence_shape import tempered_in_calibrators_order
from mrtf.trust.label_piles import label_piles
from mrtf.trust.midpoint_estimate import (
    down_to_the_vote,
    midpoint_for_adapted,
    midpoint_for_sure_labels,
    reaches_own_confidence,
    reaching_own_confidence,
    reaching_the_even_reading,
    reads_midway,
)
from mrtf.trust.neighbours import target_neighbours
from mrtf.trust.received import sample_note, sample_rows
from mrtf.trust.reliability import assess
from mrtf.trust.selection import behaviour_copies


def local_signals(state) -> Signals | None:
    """The calibration's label-free evidence from the local models' logits (read by
    ``state.storage.signals_block`` rows, None: all at once) and θ_{t+1}'s softmax, with the
    target's own neighbourhoods (mrtf.trust.neighbours: one pass over the target by blocks,
    the data only); None without local models. Read before the targets, which may overwrite
    the logits; the consensus is attached once it exists (:func:`attach_consensus`)."""
    k = state.num_local
    if k == 0:
        return None
    signals = Signals.from_logits(state.logits.view, state.before, state.before,
                                  state.storage.signals_block, k, state.dev)
    signals.neighbours = target_neighbours(state.source, device=state.dev)
    if state.config.class_frequencies is not None:
        signals.class_prior = normalised(state.config.class_frequencies)
    return signals


def attach_consensus(signals: Signals | None, targets: np.ndarray) -> None:
    if signals is not None:
        signals.consensus = np.asarray(targets, np.float32)


def calibration_of(probs: np.ndarray, signals, device: str | torch.device = "cpu",
                   fit_temperature: bool = True):
    if signals is None:
        return uncalibrated(probs, why="no teachers ran (the method has none), so there are no "
                                       "signals to calibrate with")
    return calibrate(probs, signals, device=device, fit_temperature=fit_temperature)


def calibrated(probs: np.ndarray, before: np.ndarray, signals,
               consensus_view: ConsensusView | None, device: str | torch.device = "cpu",
               adapted: bool = False, vote_probs: np.ndarray | None = None
               ) -> tuple[Any, AccuracyEstimate]:
    """The labels' calibration and the label-free estimate of their accuracy both refine
    paths report (mrtf.trust.calibration), with θ_{t+1}'s before refinement and the
    consensus' own view (optimistic where the models are weak); the temperature fitted on
    ``device`` (the refine's). ``adapted``: the labels come from a model adapted to the
    target (the adaptive default's adapt branch), whose estimate is read midway between the
    calibrator's and the labels' own confidence (midpoint_estimate.midpoint_for_adapted);
    ``vote_probs``: that model is the vote's student (option adapt_vote), these its labels
    before SHOT; the labels are then read as voted labels are, the ± reaching down to the
    vote's own interval (midpoint_estimate.down_to_the_vote). Voted labels
    (:func:`read_as_voted`) the calibrator reads as mostly right are read midway too; in
    its middle band the ± reaches the labels' own confidence. Each sample's confidence then
    keeps its rank under the calibrator and takes the tempered model's value of that rank
    (confidence_shape.py). With the user's class frequencies (``signals.class_prior``) the
    ± reaches the estimate read without them (midpoint_estimate.reaching_the_even_reading)."""
    cal = _read(probs, signals, device, adapted, vote_probs)
    if signals is not None and signals.class_prior is not None:
        even = _read(probs, replace(signals, class_prior=None), device, adapted, vote_probs)
        cal = reaching_the_even_reading(cal, even.estimated_accuracy)
    if signals is not None:
        cal = tempered_in_calibrators_order(cal, probs)
    cal = with_piles_named(cal, probs, None if signals is None else signals.class_prior)
    averaged = None if signals is None else \
        calibration_of(before, signals, device, fit_temperature=False).estimated_accuracy
    return cal, AccuracyEstimate(cal.estimated_accuracy, cal.plus_minus, cal.method, averaged,
                                 consensus_view, cal.reading)


def _read(probs: np.ndarray, signals, device: str | torch.device, adapted: bool,
          vote_probs: np.ndarray | None):
    """:func:`calibrated`'s reading of the labels by the rule their origin calls for."""
    # the temperature is fitted once, to the estimate that is printed (50 passes over probs)
    cal = calibration_of(probs, signals, device, fit_temperature=False)
    if signals is not None and vote_probs is not None:
        return _read_down_to_the_vote(cal, probs, vote_probs, signals, device)
    if signals is not None and adapted:
        return midpoint_for_adapted(cal, probs, device)
    if signals is not None:
        return read_as_voted(cal, probs, device)
    return cal


def with_piles_named(cal, probs: np.ndarray, prior: np.ndarray | None):
    """``cal`` with a note for each class the labels argmax(probs) pile onto
    (mrtf.trust.label_piles; against the user's class frequencies when given)."""
    piles = label_piles(np.asarray(probs).argmax(1), probs.shape[1], prior)
    return replace(cal, notes=[*(p.line() for p in piles), *cal.notes]) if piles else cal


def read_as_voted(cal, probs: np.ndarray, device: str | torch.device = "cpu", *,
                  fit_temperature: bool = True):
    """The calibrator's ``cal`` of labels that are not adapted: read midway where it reads
    them as mostly right (midpoint_estimate.midpoint_for_sure_labels), else its own estimate
    with, in its middle band, a ± reaching the labels' own confidence; the temperature
    fitted to the estimate unless ``fit_temperature`` is False (only the interval is read)."""
    if reads_midway(cal):
        return midpoint_for_sure_labels(cal, probs, device, fit_temperature=fit_temperature)
    if reaches_own_confidence(cal):
        cal = reaching_own_confidence(cal, probs)
    else:  # the lowest band: its ± reaches down to chance (calibration.band_error)
        cal = replace(cal, reading="lowest band")
    if not fit_temperature:
        return cal
    return replace(cal, temperature=temperature_for(probs, cal.estimated_accuracy,
                                                    device=device))


def _read_down_to_the_vote(cal, probs: np.ndarray, vote_probs: np.ndarray, signals,
                           device: str | torch.device):
    """Labels of the vote's student adapted (option adapt_vote): read as voted, the ± reaching
    down to the vote's own interval (midpoint_estimate.down_to_the_vote). Both readings are
    intervals only; the temperature is fitted once, to the estimate printed (at 10⁶ rows a
    fit is seconds)."""
    read = read_as_voted(cal, probs, device, fit_temperature=False)
    vote = read_as_voted(calibration_of(vote_probs, signals, device, False), vote_probs,
                         device, fit_temperature=False)
    out = down_to_the_vote(read, vote, probs, device)
    if out is not read:
        return out  # widened: fitted to the new estimate there
    return replace(read, temperature=temperature_for(probs, read.estimated_accuracy,
                                                     device=device))


def consensus_account(adaptive) -> ConsensusAccount:
    """The adaptive method's account: each source's weight and why, the class prior."""
    return ConsensusAccount(tuple(adaptive.sources), adaptive.confidence,
                            adaptive.cluster_weight, adaptive.debias_strength,
                            class_prior_used(adaptive))


def consensus_view(adaptive, probs: np.ndarray, before: np.ndarray) -> ConsensusView | None:
    """Label-free accuracy estimates of the refined and the averaged model under the
    consensus (None when no model was informative)."""
    if adaptive.consensus is None:
        return None
    post = adaptive.consensus.posterior
    return ConsensusView(estimated_accuracy(post, probs), estimated_accuracy(post, before))


def class_prior_used(adaptive) -> ClassPriorUsed | None:
    """The class prior the consensus used, and why, with the line ``refine`` prints (None for
    the learned prior when nothing was chosen)."""
    bias = f"each model's class bias divided out (strength {adaptive.debias_strength:.2f})"
    if adaptive.class_shares is not None and adaptive.prior is None:
        return ClassPriorUsed("given", f"class prior: the class frequencies given, {bias} "
                                       f"toward them")
    if adaptive.prior is not None:
        line = adaptive.prior.line()
        return ClassPriorUsed(adaptive.prior.chosen,
                              line + (f"; {bias}" if adaptive.debias_strength > 0 else ""),
                              adaptive.prior)
    if adaptive.debias_strength > 0:
        return ClassPriorUsed("uniform", f"class prior: uniform (as given), {bias}")
    return None


@dataclass
class Trusted:
    """What the reliability check left: the kept local models (ReceivedModel), their target
    logits (K', M, C) (None when measured on a subset), their consensus factors, the full
    report, and the rows it was measured on (None: all)."""

    kept: list
    logits: np.ndarray | None
    factors: list[float]
    report: Any
    rows: np.ndarray | None = None
    #: whether the parties share a basin (mrtf.trust.basin.Basin) and the line said about it
    basin: Any = None
    basin_line: str | None = None

    def checks(self, aggregate: str) -> PartyChecks:
        """What refine reports: per-party reliability and verdicts, the aggregate, the basin."""
        basin = None if self.basin is None else BasinVerdict(
            self.basin_line, self.basin.cosine, self.basin.average_agreement,
            self.basin.party_agreement, self.basin.shared_start, self.basin.average_works)
        return PartyChecks(tuple(self.report.parties), aggregate,
                           None if self.rows is None else len(self.rows), basin)


def apply_trust(plan, source, config: RefineConfig, dev: torch.device,
                student_given: bool) -> Trusted:
    """Measure every local model on the target set (mrtf.trust.reliability), leave the
    excluded ones out of the teachers and rebuild θ_{t+1} from the others with claim-checked,
    verdict-scaled weights and ``config.aggregate``. Changes ``plan`` in place.

    Above mrtf.trust.received.TRUST_SAMPLE target samples they are measured on a subset
    seeded by ``config.seed`` (the same in both refine paths and ``inspect --data``) and no
    logits are kept; else on every sample, and the kept models' logits are returned for
    reuse as teachers."""
    locals_r = plan.locals_received
    total = len(source)
    rows = sample_rows(total, config.seed)
    seen = source if rows is None else RowSubset(source, rows)
    out = teacher_logits(plan.locals_, seen, config.inference_batch, dev, None,
                         config.stack, progress=config.progress)
    check_finite(out.logits)
    locals_r, logits = drop_behaviour_copies(plan, locals_r, out.logits)
    k = len(locals_r)
    states = None if plan.heterogeneous else [m.state_dict for m in locals_r]
    # one start or not, from the weights (a median: one odd party does not move it) ...
    cosine = None if states is None else weight_cosine(states)
    shared = cosine is None or cosine >= SHARED_COSINE
    start = plan.start_received if shared else None
    report = assess(plan.names[:k], logits, states,
                    [m.meta.n_samples for m in locals_r], [m.meta.train_loss for m in locals_r],
                    None if start is None else start.state_dict, shared)
    if rows is not None:
        report.notes.append(sample_note(rows, total, config.seed))
    keep = _act(plan, locals_r, report, config, dev, student_given)
    # ... and whether the average of the parties kept (the one refine would use) agrees
    basin = _basin(plan, cosine, logits[keep], seen, config, dev)
    line = None if basin is None else basin.line() if basin.average_works else \
        _no_average(plan, basin, student_given)
    if line is not None:
        plan.notes.insert(0, line)
    plan.notes.extend(f"party reliability: {n}" for n in report.notes)
    # a claim of a party not trusted is not used for u_t either (st+rd, mrtf)
    kept = [locals_r[i] for i in keep if report.parties[i].verdict == "trusted"] or \
        [locals_r[i] for i in keep]
    return Trusted(kept, logits[keep] if rows is None else None,
                   [report.parties[i].factor for i in keep], report, rows, basin, line)


def drop_behaviour_copies(plan, locals_r: list, logits: np.ndarray) -> tuple[list, np.ndarray]:
    """Local models that act as copies of another on the target (mrtf.trust.selection's
    behaviour rule) count once: the later ones leave ``plan`` (named in its notes)."""
    drop: set[int] = set()
    for g in behaviour_copies(logits):
        names = [plan.names[i] for i in g]
        plan.notes.append(f"{len(g)} parties act as one model on the target "
                          f"({', '.join(names)}): counted once ({names[0]})")
        drop.update(g[1:])
    if not drop:
        return locals_r, logits
    keep = [i for i in range(len(locals_r)) if i not in drop]
    plan.locals_ = [plan.locals_[i] for i in keep]
    plan.names = [plan.names[i] for i in keep] + plan.names[len(locals_r):]
    return [locals_r[i] for i in keep], logits[keep]


def _basin(plan, cosine: float | None, logits: np.ndarray, seen, config: RefineConfig,
           dev: torch.device):
    """Whether the parties share a basin (mrtf.trust.basin): ``cosine`` of their weights,
    and θ_{t+1}'s labels on the rows the checks read against the kept parties' ensemble
    (``logits``). None when there is no average to judge (parties of different
    architectures, or fewer than 2)."""
    if plan.agg is None or cosine is None or len(logits) < 2:
        return None
    out = teacher_logits([plan.agg], seen, config.inference_batch, dev, None, config.stack)
    return assess_basin(cosine, logits, out.logits[0])


def _no_average(plan, basin, student_given: bool) -> str:
    """No parameter average (the parties share no basin): θ_{t+1} is dropped, θ_t too when
    they did not start from it, and the student starts from the kept party that agrees most
    with the ensemble (or is the one the caller gave). Returns the line to say."""
    k = len(plan.locals_)  # the kept parties; plan.names[:k] are theirs
    plan.agg = None
    if not basin.shared_start:
        plan.start = None
    who = plan.names[basin.best]
    if not student_given:
        plan.student = copy.deepcopy(plan.locals_[basin.best])
    plan.names = plan.names[:k] + (["θ_t (the round's starting model)"]
                                   if plan.start is not None else []) + \
        ["the student" if student_given else f"the student (starts as party {who})"]
    return basin.line(None if student_given else who)


def _act(plan, locals_r: list, report, config: RefineConfig, dev: torch.device,
         student_given: bool) -> list[int]:
    """The verdicts applied to ``plan``: the excluded parties out of the teachers, θ_{t+1}
    rebuilt from the others (claim-checked, verdict-scaled weights, ``config.aggregate``) when
    anyone was flagged or the aggregate is not the mean. Returns the kept indices."""
    k = len(locals_r)
    keep = [i for i in range(k) if i not in report.excluded]
    if not keep:  # nobody left to learn from: keep everyone, and say so
        keep = list(range(k))
        report.notes.append("every party was flagged for exclusion; all are kept")
    for p in report.parties:
        if p.verdict != "trusted":
            plan.notes.append(f"party {p.line()}")
    if len(keep) < k or any(p.verdict != "trusted" for p in report.parties) or \
            config.aggregate != "mean":
        if not plan.heterogeneous and plan.agg is not None:
            w = [report.weights[i] for i in keep]
            if sum(w) <= 0:
                w = [1.0] * len(keep)
            agg, _ = average_received([locals_r[i] for i in keep], weights=w,
                                      aggregate=config.aggregate)
            plan.agg = agg.to(dev)
            if not student_given:
                plan.student = copy.deepcopy(plan.agg)
    plan.locals_ = [plan.locals_[i] for i in keep]
    plan.names = [plan.names[i] for i in keep] + plan.names[k:]
    return keep
