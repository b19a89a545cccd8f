"""The pipeline's first stages: who teaches and who learns (checked before any heavy work),
the party reliability checks, and what the output should say about the inputs. The one place
the refinery selects received models (``newest_locals``, ``newest_global``)."""

from __future__ import annotations

import copy
import json

import numpy as np
import torch
from torch import nn

from mrtf.averaging import average_received
from mrtf.errors import InputError, first_line
from mrtf.refinery.rectify import U_FALLBACK, u_t
from mrtf.refinery.state import Plan, RefineState
from mrtf.refinery.teachers import newest_global, newest_locals
from mrtf.refinery.trusted import apply_trust
from mrtf.trust.selection import select


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


def _arch_id(m) -> tuple[str, str]:
    return m.meta.arch, json.dumps(m.meta.arch_kwargs, sort_keys=True)


def _party(m) -> str:
    return m.meta.party or m.path.stem


def plan_models(state: RefineState, student: nn.Module | None) -> None:
    """Stage 1: ``state.plan``: the teachers S_t (the newest round's local models), θ_t,
    θ_{t+1} (their parameter average, ``--aggregate``) and the student; every received
    architecture and the student are checked on one target sample first."""
    received, source, config, dev = state.received, state.source, state.config, state.dev
    if len(source) == 0:
        raise InputError("the target set is empty (0 samples)")
    locals_r = newest_locals(received)
    if not locals_r:
        raise InputError("no received model has role 'local'; nothing to refine")
    c = received.num_classes
    # an ONNX party (m.onnx) only teaches: its graph is never in a parameter average
    hetero = len({_arch_id(m) for m in locals_r}) > 1 or any(m.onnx for m in locals_r)
    notes: list[str] = []
    for m in {_arch_id(m): m for m in received.models}.values():
        check_fits(m.build("cpu"), m.path.name, source, c, torch.device("cpu"))
    locals_ = [m.build(dev) for m in locals_r]
    agg = start = None
    newest = newest_global(received)
    if hetero:
        if student is None:
            raise InputError("received models differ in architecture: there is no parameter "
                             "average; give a student (--student-arch ARCH or --student FILE)")
        if state.method.teachers == "none":
            raise InputError(f"method {state.method.name} needs local models of one "
                             "architecture")
        notes.append("heterogeneous parties: no parameter average; the student's own "
                     "predictions stand for both θ_t and θ_{t+1} in self-teaching (Eq. 10) and "
                     "its features are used for the clustered label refinery")
    else:
        agg, _ = average_received(locals_r, aggregate=config.aggregate)
        agg = agg.to(dev)
        if newest is not None:
            start = newest.build(dev)
        elif state.method.teachers == "all":
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
    state.plan = Plan(locals_, start, agg, student, hetero, notes, names, locals_r, newest)


def check_parties(state: RefineState) -> None:
    """Stage 2: the party reliability checks (mrtf.trust, when ``config.trust_on``): the
    excluded parties leave the teachers and θ_{t+1}; then u_t (Eq. 10) from the claims that
    count, the teachers, and the notes."""
    plan, config = state.plan, state.config
    assert plan is not None
    if config.trust_on:
        state.trusted = apply_trust(plan, state.source, config, state.dev, state.student_given)
    state.used = plan.locals_received if state.trusted is None else state.trusted.kept
    state.u = u_t([m.meta.train_loss for m in state.used], state.received.num_classes)
    state.notes = notes_on_inputs(state)
    state.teachers = state.method.teacher_list(plan.locals_, plan.start, state.self_model)
    if state.trusted is not None:
        state.factors = state.trusted.factors + [1.0] * (len(state.teachers) - len(plan.locals_))


def notes_on_inputs(state: RefineState) -> list[str]:
    """What the output should say about the inputs: the plan's and the checks' notes, how the
    target is read, older rounds' local models, u_t's fall-back, class frequencies the method
    does not read, then the method's own."""
    plan = state.plan
    assert plan is not None
    notes = list(plan.notes)
    if state.input_reading is not None:
        notes.append(state.input_reading.line())
    chosen = select(state.received)  # refused claims and copies are named, not counted older
    notes += [f"refused: {line}" for line in chosen.suspicious]
    older = sum(1 for f in chosen.not_used if f.role == "local" and not f.suspicious)
    if older:
        notes.append(f"{older} local models of earlier rounds are not teachers (only the "
                     "newest round's models are S_t)")
    if state.method.uses_u_t and all(m.meta.train_loss is None for m in plan.locals_received):
        notes.append(f"no local model reported train_loss: u_t = {U_FALLBACK} (fallback)")
    return notes + unread_class_frequencies(state) + state.method.notes(state)


def unread_class_frequencies(state: RefineState) -> list[str]:
    """One note when the user gave class frequencies and the method's labels have no class
    prior to aim at them (``Method.takes_class_frequencies``): otherwise they would seem to
    have steered the labels. The label-free estimate still reads them where it runs, which
    needs teachers (refinery.trusted.local_signals)."""
    method = state.method
    if state.config.class_frequencies is None or method.takes_class_frequencies:
        return []
    readers = ("only the label-free estimate reads them" if method.teachers != "none"
               else "nothing in this run reads them (no teachers: no label-free estimate)")
    return [f"class frequencies: method {method.name} has no class prior; {readers}"]
