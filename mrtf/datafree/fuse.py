"""Data-free fusion of received models: choose FedFTG or FedKF, run it, report.

``fuse`` is a pure function of (received models, config, optional student) → result: it never
writes files (see :func:`mrtf.datafree.samples.dump_samples` for the one thing that does).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import nn

from mrtf.averaging import average_received
from mrtf.datafree.common import collapse_warning, image_shape_of
from mrtf.datafree.config import FusionConfig
from mrtf.datafree.fedftg import run_fedftg
from mrtf.datafree.fedkf import aca_average, latest_per_party, oca_average, run_fedkf
from mrtf.device import pick_device
from mrtf.errors import InputError
from mrtf.progress import bar as progress_bar
from mrtf.trust.selection import select_locals


@dataclass
class FusionResult:
    """A fused model (eval mode, on the CPU, like the received models) and how it was made."""

    model: nn.Module
    method: str
    reason: str
    history: list[dict[str, float]]
    generator: nn.Module | None  # None when the work was skipped (fedkf_futile)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _locals(received) -> list:
    models = received.by_role("local") if hasattr(received, "by_role") else list(received)
    models = [m for m in models if m.meta.role == "local"]
    if not models:
        raise InputError("no local models received (role 'local'): nothing to fuse")
    return models


def choose_method(received, forced: str | None = None) -> tuple[str, str]:
    """('fedftg' | 'fedkf', reason). FedFTG needs per-class label counts from every local
    party (Eq. 9-10); without them FedKF, which needs none, is chosen. Forcing FedFTG when a
    party has no counts is an InputError."""
    models = _locals(received)
    missing = [m.name for m in models if m.meta.label_counts is None]
    if forced not in (None, "fedftg", "fedkf"):
        raise InputError(f"unknown data-free method {forced!r}; choose fedftg or fedkf")
    if forced == "fedkf":
        return "fedkf", "FedKF chosen by the caller"
    if forced == "fedftg":
        if missing:
            raise InputError(f"FedFTG needs label counts, but {missing[0]} has no label counts: "
                             "use --datafree fedkf or give counts")
        return "fedftg", "FedFTG chosen by the caller"
    if missing:
        return "fedkf", (f"{len(missing)} of {len(models)} local models carry no label counts "
                         f"(e.g. {missing[0]}), so FedKF, which needs none")
    return "fedftg", (f"all {len(models)} local models carry label counts: FedFTG with "
                      "label sampling and class-level ensemble")


def _bar(cfg: FusionConfig, total: int, desc: str, unit: str):
    return progress_bar(total, desc, unit, enabled=cfg.progress)


def _fuse_fedftg(models: Sequence, cfg: FusionConfig, student: nn.Module | None, dev
                 ) -> tuple[nn.Module, list[dict[str, float]], nn.Module, object, list[str]]:
    # FedFTG's teachers are this round's local models S_t (round claims checked, copies once:
    # mrtf.trust.selection); older rounds' files only feed FedKF's OCA teacher.
    models = select_locals(models)
    start = copy.deepcopy(student) if student is not None else average_received(models)[0]
    counts = [m.meta.label_counts for m in models]
    shape = image_shape_of(models[0].meta)
    with _bar(cfg, cfg.rounds * cfg.iterations, "FedFTG", "iteration") as bar:
        def tick(rec: dict[str, float]) -> None:
            bar.set_postfix(gen=f"{rec['gen_loss']:.3f}", md=f"{rec['md_student']:.4f}")
            bar.update()
        st = run_fedftg([m.build(dev) for m in models], counts, start, shape, cfg, dev, tick)
    return st.student, st.history, st.generator, st.last_batch, []


def fedkf_futile(models: Sequence, student: nn.Module | None = None) -> str | None:
    """Why FedKF cannot change the parameter average here, known before any training: every
    party's latest model is from one round, so the OCA teacher (each party's latest model,
    averaged) equals the ACA average the student starts from. None when FedKF can help."""
    if student is not None:
        return None
    local = [m for m in models if m.meta.role == "local"]
    rounds = {m.meta.round for m in latest_per_party(local)}
    if len(rounds) > 1:
        return None
    which = "one round" if None in rounds else f"round {next(iter(rounds)) + 1}"
    return (f"every party's latest model is from {which}, so FedKF's OCA teacher equals the "
            "ACA average it starts from and the result is the parameter average; it was "
            "written without training. For a fusion that can differ: --datafree fedftg "
            "(needs label counts) or models of several rounds (simulate --export-history)")


def _fuse_fedkf(models: Sequence, cfg: FusionConfig, student: nn.Module | None, dev
                ) -> tuple[nn.Module, list[dict[str, float]], nn.Module, object, list[str]]:
    teacher, _ = oca_average(models)
    notes: list[str] = []
    if student is not None:
        start = copy.deepcopy(student)
    else:
        start, _ = aca_average(models)
        why = fedkf_futile(models, student)
        if why and cfg.skip_futile:
            return start, [], None, None, [f"fedkf skipped: {why}"]
        if why:
            notes.append(f"fedkf: {why}")
    shape = image_shape_of(models[0].meta)
    with _bar(cfg, cfg.steps, "FedKF", "step") as bar:
        def tick(rec: dict[str, float]) -> None:
            bar.set_postfix(gen=f"{rec['gen_loss']:.3f}", kl=f"{rec['kl_student']:.4f}")
            bar.update()
        st = run_fedkf(teacher, start, shape, models[0].meta.num_classes, cfg, dev, tick)
    return st.student, st.history, st.generator, st.last_batch, notes


def fuse(received, config: FusionConfig | None = None, student: nn.Module | None = None
         ) -> FusionResult:
    """Fuse the received local models into one model without data.

    ``received`` is a :class:`mrtf.io.bundles.ReceivedSet` (or a list of ReceivedModel);
    ``student`` (optional) is the module to fine-tune, else FedFTG starts from the parameter
    average of the local models and FedKF from the ACA average. Raises InputError for bad
    inputs and FusionError when a loss turns NaN.
    """
    t0 = time.perf_counter()
    cfg = (config or FusionConfig()).validate()
    models = _locals(received)
    method, reason = choose_method(models, cfg.method)
    cfg = cfg.resolved(method)
    dev = pick_device(cfg.device)
    run = _fuse_fedftg if method == "fedftg" else _fuse_fedkf
    model, history, generator, last, notes = run(models, cfg, student, dev)
    warnings = notes + (collapse_warning(last, cfg.collapse_tol, method)
                        if last is not None else [])
    return FusionResult(model=model.eval().cpu(), method=method, reason=reason,
                        history=history, generator=None if generator is None else generator.cpu(),
                        warnings=warnings,
                        seconds=time.perf_counter() - t0)
