"""The refinery pipeline: received models + unlabeled target set → refined model + labels.

``refine`` is a pure function of (models, data, config): teachers' logits are computed once
(teachers.py), turned into distillation targets by the chosen method (Eq. 3, 6-7, 10, 11-12),
and distilled into θ_{t+1} or a student (Eq. 1-2); the adaptive method adapts θ_{t+1} with
SHOT instead when the target is new to the parties (novelty.py). The target's ``y`` is never
read. Large target sets go to the streaming refinery (streaming.py, ``RefineConfig.stream``),
which gives the same labels with memory flat in M (it always distils the vote).
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from mrtf.averaging import average_received
from mrtf.device import pick_device
from mrtf.errors import InputError, first_line
from mrtf.refinery.adaptive import adaptive_targets, input_independent
from mrtf.refinery.cluster import prototype_targets
from mrtf.refinery.config import METHOD_SPECS, METHODS, REF_STD_BATCH, VARIANTS, RefineConfig
from mrtf.refinery.fit import fit_student
from mrtf.refinery.neighbour_vote import final_probs
from mrtf.refinery.novelty import Novelty, target_novelty
from mrtf.refinery.rectify import U_FALLBACK, rectified_targets, u_t
from mrtf.refinery.teachers import (
    TeacherOutputs,
    _softmax_np,
    avg_logit,
    avg_prob,
    check_finite,
    global_stds,
    newest_global,
    newest_locals,
    predict_probs,
    stabilized_probs,
    teacher_logits,
)
from mrtf.refinery.trusted import adaptive_info, apply_trust, calibrated, signals_of, trust_on
from mrtf.trust.neighbours import target_neighbours
from mrtf.trust.selection import select

__all__ = ["METHODS", "METHOD_SPECS", "VARIANTS", "RefineConfig", "RefineResult", "refine"]


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


def _arch_id(m) -> tuple[str, str]:
    return m.meta.arch, json.dumps(m.meta.arch_kwargs, sort_keys=True)


def check_fits(model: nn.Module, name: str, source, num_classes: int,
                dev: torch.device) -> None:
    """One forward on one target sample: raises InputError when the shape does not fit or the
    class count differs."""
    x = torch.from_numpy(np.ascontiguousarray(source.read(0, 1))).to(dev)
    try:
        with torch.inference_mode():
            logits = model.to(dev).eval()(x)
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        raise InputError(f"target images of shape {tuple(source.sample_shape)} do not fit "
                         f"model {name} ({first_line(exc, 100)})") from None
    if logits.dim() != 2 or logits.shape[1] != num_classes:
        raise InputError(f"{name} predicts {tuple(logits.shape[1:])} classes but the received "
                         f"models have {num_classes}")


@dataclass
class _Plan:
    """Who teaches and who learns, before any heavy work."""

    locals_: list[nn.Module]
    start: nn.Module | None  # θ_t
    agg: nn.Module | None  # θ_{t+1}
    student: nn.Module  # starts distillation (θ_{t+1} copy or the given student)
    heterogeneous: bool
    notes: list[str]
    names: list[str]  # the local models' party names, then θ_t's and θ_{t+1}'s


def _party(m) -> str:
    return m.meta.party or m.path.stem


def _plan(received, source, config: RefineConfig, student: nn.Module | None,
          dev: torch.device) -> _Plan:
    if len(source) == 0:
        raise InputError("the target set is empty (0 samples)")
    locals_r = newest_locals(received)
    if not locals_r:
        raise InputError("no received model has role 'local'; nothing to refine")
    c = received.num_classes
    hetero = len({_arch_id(m) for m in locals_r}) > 1
    notes: list[str] = []
    for m in {_arch_id(m): m for m in received.models}.values():
        check_fits(m.build("cpu"), m.path.name, source, c, torch.device("cpu"))
    locals_ = [m.build(dev) for m in locals_r]
    agg = start = None
    if hetero:
        if student is None:
            raise InputError("received models differ in architecture: there is no parameter "
                             "average; give a student (--student-arch ARCH or --student FILE)")
        if config.method == "fedavg":
            raise InputError("method fedavg needs local models of one architecture")
        notes.append("heterogeneous parties: no parameter average; the student's own "
                     "predictions stand for both θ_t and θ_{t+1} in self-teaching (Eq. 10) and "
                     "its features are used for the clustered label refinery")
    else:
        agg, _ = average_received(locals_r, aggregate=config.aggregate)
        agg = agg.to(dev)
        newest = newest_global(received)
        if newest is not None:
            start = newest.build(dev)
        elif METHOD_SPECS[config.method].teachers == "all":
            notes.append("no θ_t (role 'global') received: θ_{t+1} is used for both "
                         "self-teaching terms of Eq. 10")
    if student is not None:
        check_fits(student, "student", source, c, torch.device("cpu"))
        student = copy.deepcopy(student).to(dev)  # the caller's module is not changed
    else:
        student = copy.deepcopy(agg)
    names = [_party(m) for m in locals_r]
    if start is not None:
        names.append("θ_t (the round's starting model)")
    names.append("θ_{t+1} (parameter average)" if agg is not None else "the student")
    return _Plan(locals_, start, agg, student, hetero, notes, names)


TARGET_CHUNK = 16 * REF_STD_BATCH  # samples per block; a multiple of the reference std block


def _stabilized_blocks(logits: np.ndarray, config: RefineConfig):
    """Yield ``(start, q (K, m, C))`` of Eq. 6 block by block: the std is over all samples
    and classes (one global pass per teacher), the softmax per block, so memory stays at the
    (K, M, C) logits plus one block instead of several (K, M, C) float64 temporaries."""
    k_all, m = logits.shape[:2]
    if config.variant == "paper":
        stds = global_stds(logits)  # block-wise: the same numbers for a spilled array
        for s in range(0, m, TARGET_CHUNK):
            block = logits[:, s:s + TARGET_CHUNK]
            yield s, np.stack([_softmax_np(config.tau * block[k] / (stds[k] + 1e-8))
                               for k in range(k_all)])
        return
    for s in range(0, m, TARGET_CHUNK):  # per-batch std (reference code), no τ
        yield s, stabilized_probs(logits[:, s:s + TARGET_CHUNK], config.tau, "batch",
                                  REF_STD_BATCH)


def ensemble_targets(logits: np.ndarray, num_local: int, config: RefineConfig, u: float
                     ) -> np.ndarray:
    """FedDF (Eq. 3), ST (Eq. 6-7) or ST+RD (Eq. 10) targets (M, C) float32, block by block.

    logits (K, M, C): the ``num_local`` local models first, then θ_t and θ_{t+1} (or only
    θ_{t+1}, or the student) for self-teaching. ``config.method`` picks the equation.
    """
    k = num_local
    out = np.empty(logits.shape[1:], dtype=np.float32)
    if config.method == "feddf":
        for s in range(0, logits.shape[1], TARGET_CHUNK):
            out[s:s + TARGET_CHUNK] = avg_logit(logits[:k, s:s + TARGET_CHUNK])
        return out
    for s, probs in _stabilized_blocks(logits, config):
        local = probs[:k]
        if config.method == "st":
            out[s:s + len(local[0])] = avg_prob(local)
        else:  # [θ_t, θ_{t+1}] or [θ_{t+1}] or [student] follow the local models
            out[s:s + len(local[0])] = rectified_targets(local, probs[k], probs[-1], u,
                                                         config.variant)
    return out


def _targets(plan: _Plan, logits: np.ndarray, feats: np.ndarray | None, config: RefineConfig,
             u: float, skip_clr: bool, self_probs: np.ndarray, factors: list[float] | None = None,
             neighbours: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """Distillation targets (M, C) for the method, and what went into them (``clr`` seconds;
    for adaptive the per-source trust and its class-prior choice, from ``neighbours``)."""
    if config.method == "adaptive":
        t0 = time.perf_counter()
        probs = np.concatenate([q for _, q in _stabilized_blocks(logits, config)], axis=1)
        out = adaptive_targets(probs, plan.names, self_probs, feats, config.seed,
                               len(plan.locals_), config.class_prior, factors, neighbours)
        return out.targets, {"clr": time.perf_counter() - t0, "adaptive": out}
    targets = ensemble_targets(logits, len(plan.locals_), config, u)
    if not METHOD_SPECS[config.method].features or skip_clr or config.clr_iterations == 0:
        return targets, {"clr": 0.0}
    t0 = time.perf_counter()
    assert feats is not None
    refined = prototype_targets(targets, feats, config.tau, config.clr_iterations,
                                config.variant, use_gpu=torch.cuda.is_available())
    return refined, {"clr": time.perf_counter() - t0}


def refine(received, source, config: RefineConfig | None = None,
           student: nn.Module | None = None) -> RefineResult:
    """Refine received models on the unlabeled target ``source`` (H5Dataset or ArraySource).

    received : ReceivedSet (role 'local' models teach; role 'global' is θ_t).
    student : the model to refine when the parties' architectures differ (or to replace
        θ_{t+1} as the distillation start); must predict ``received.num_classes`` classes.
    Same inputs and seed → identical results (bit for bit on the same machine).
    """
    config = config or RefineConfig()
    config.validate()
    from mrtf.refinery.streaming import refine_streaming, streams

    if streams(received, source, config):
        return refine_streaming(received, source, config, student)
    dev = pick_device(config.device)
    spec = METHOD_SPECS[config.method]
    plan = _plan(received, source, config, student, dev)
    timings: dict[str, float] = {"teachers": 0.0, "clr": 0.0, "distill": 0.0, "predict": 0.0,
                                 "calibration": 0.0}
    t0 = time.perf_counter()
    trusted = apply_trust(plan, received, source, config, dev, student is not None) \
        if trust_on(config) else None
    used = newest_locals(received) if trusted is None else trusted.kept
    u = u_t([m.meta.train_loss for m in used], received.num_classes)
    notes, skip_clr = _notes(received, plan, config)
    self_model = plan.agg if plan.agg is not None else plan.student
    teachers = spec.teacher_list(plan.locals_, plan.start, self_model)
    out, before = _teacher_outputs(teachers, plan, self_model, trusted,
                                   spec.features and not skip_clr, source, config, dev)
    timings["teachers"] = time.perf_counter() - t0
    student_model = _live_start(plan, before, config, notes, student is not None)
    extra: dict[str, Any] = {}
    signals = None
    if out is None:  # fedavg: θ_{t+1} as it is
        model, targets = self_model.eval(), before
    else:
        factors = None if trusted is None else trusted.factors + [1.0] * (len(teachers)
                                                                          - len(plan.locals_))
        t0 = time.perf_counter()  # the target's neighbourhoods: calibration and class prior
        neighbours = target_neighbours(source) if len(plan.locals_) else None
        timings["calibration"] = time.perf_counter() - t0
        targets, extra = _targets(plan, out.logits, out.features, config, u, skip_clr, before,
                                  factors, neighbours)
        timings["clr"] = extra.pop("clr")
        t0 = time.perf_counter()
        signals = signals_of(out.logits[:len(plan.locals_)], before, targets, source, neighbours)
        timings["calibration"] += time.perf_counter() - t0
        novelty = _novelty(plan, out.logits, used, config, student is not None)
        out.logits = out.features = None  # free (K, M, C) before distilling
        t0 = time.perf_counter()
        model = fit_student(student_model, source, targets, config, dev, novelty)
        timings["distill"] = time.perf_counter() - t0
        if novelty is not None:
            extra["novelty"] = novelty
    return finish(model, source, bool(teachers), targets, before, plan, u, notes,
                  extra.get("adaptive"), extra.get("novelty"), signals, trusted, config,
                  timings, dev)


def _teacher_outputs(teachers: list[nn.Module], plan: _Plan, self_model: nn.Module, trusted,
                     features: bool, source, config: RefineConfig, dev: torch.device
                     ) -> tuple[TeacherOutputs | None, np.ndarray]:
    """The teachers' logits on the target (the locals' reused when the trust checks ran them
    already) and θ_{t+1}'s softmax, ``before`` (read off the logits when it is the last)."""
    if not teachers:
        return None, predict_probs(self_model, source, config.inference_batch, dev)
    # the local models ran already (unless the checks read a sample of a large target)
    done = 0 if trusted is None or trusted.logits is None else len(plan.locals_)
    out = teacher_logits(teachers[done:], source, config.inference_batch, dev,
                         self_model if features else None, config.stack,
                         progress=config.progress) if len(teachers) > done else None
    if done:
        out = TeacherOutputs(trusted.logits, None, 0, 0, 0) if out is None else \
            TeacherOutputs(np.concatenate([trusted.logits, out.logits]), out.features,
                           out.stacked_groups, out.looped_groups, out.fast_groups)
    check_finite(out.logits)
    if teachers[-1] is self_model:
        return out, _softmax_np(out.logits[-1])
    return out, predict_probs(self_model, source, config.inference_batch, dev)


def finish(model: nn.Module, source, taught: bool, targets: np.ndarray, before: np.ndarray,
           plan: _Plan, u: float | None, notes: list[str], adaptive, novelty: Novelty | None,
           signals, trusted, config: RefineConfig, timings: dict[str, float],
           dev: torch.device, streaming: bool = False) -> RefineResult:
    """The result both refine paths return: the labels (the neighbour vote, the model's
    softmax, or θ_{t+1}'s without teachers) and ``info`` with the adaptive method's account,
    the vote-or-adapt choice, the vote, the calibration (timed) and the party reliability."""
    t0 = time.perf_counter()
    probs, vote = (before, None) if not taught else \
        final_probs(model, source, config.vote_k, config.inference_batch, dev, config.stack)
    timings["predict"] = time.perf_counter() - t0
    info = {"method": config.method, "variant": config.variant, "u_t": u,
            "teachers": len(plan.locals_), "heterogeneous": plan.heterogeneous,
            "notes": notes, "config": asdict(config)} | ({"streaming": True} if streaming else {})
    if vote is not None:
        info["neighbour_vote"] = vote.info()
    if adaptive is not None:
        info.update(adaptive_info(adaptive, probs, before))
    if novelty is not None:
        info["novelty"] = {**asdict(novelty), "line": novelty.line()}
    t0 = time.perf_counter()
    cal, entries = calibrated(probs, before, signals, info.get("estimated_accuracy"))
    info.update(entries)
    timings["calibration"] += time.perf_counter() - t0
    if trusted is not None:
        info.update(trusted.info(config.aggregate))
    return RefineResult(model.eval().cpu(), probs, targets, before, info, timings, cal,
                        None if vote is None else vote.probs)


def _novelty(plan: _Plan, logits: np.ndarray, used, config: RefineConfig,
             student_given: bool) -> Novelty | None:
    """The adaptive method's vote-or-adapt choice (novelty.py); None for the other methods
    and without a θ_{t+1} to adapt (parties of different architectures, a given student)."""
    if config.method != "adaptive" or plan.agg is None or student_given:
        return None
    return target_novelty(logits, [m.meta.train_loss for m in used],
                          num_local=len(plan.locals_))


def _live_start(plan: _Plan, before: np.ndarray, config: RefineConfig, notes: list[str],
                student_given: bool) -> nn.Module:
    """The model distillation starts from. A dead θ_{t+1} (the same output for every sample)
    has zero gradients through its ReLUs and cannot be distilled back to life; the adaptive
    method then starts from θ_t when it has one (a student the caller gave is kept)."""
    if config.method != "adaptive" or student_given or plan.start is None \
            or not input_independent(before):
        return plan.student
    notes.append("θ_{t+1} gives the same output for every sample (dead network): "
                 "distillation starts from θ_t")
    return copy.deepcopy(plan.start)


def _notes(received, plan: _Plan, config: RefineConfig) -> tuple[list[str], bool]:
    """What the output should say about the inputs, and whether MrTF's CLR is skipped."""
    notes = list(plan.notes)
    chosen = select(received)  # refused claims and copies are named, not counted as older
    notes += [f"refused: {line}" for line in chosen.suspicious]
    older = sum(1 for f in chosen.not_used if f.role == "local" and not f.suspicious)
    if older:
        notes.append(f"{older} local models of earlier rounds are not teachers (only the "
                     "newest round's models are S_t)")
    if all(m.meta.train_loss is None for m in newest_locals(received)) and \
            config.method in ("st+rd", "mrtf"):
        notes.append(f"no local model reported train_loss: u_t = {U_FALLBACK} (fallback)")
    rounds = [m.meta.round for m in received.models if m.meta.round is not None]
    skip_clr = config.method == "mrtf" and bool(rounds) and max(rounds) < config.clr_min_round
    if skip_clr:
        # rounds are 0-based in memory and counted from 1 on screen and in files
        notes.append(f"round {max(rounds) + 1} is within the first {config.clr_min_round} "
                     "rounds (--clr-min-round): clustered label refinery skipped")
    return notes, skip_clr

