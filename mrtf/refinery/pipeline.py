"""The refinery pipeline: received models + unlabeled target set → refined model + labels.

``refine`` is a pure function of (models, data, config), one sequence of named stages over a
typed state (state.RefineState), for every method and either storage:

1. ``plan_models``: who teaches and who learns (plan.py), checked on one target sample;
2. ``align_input``: how the target's images are read (input_reading.py), then
   ``check_parties``: the party reliability checks when on (trusted.py), u_t, the notes;
3. ``teach``: the data pass: teachers' logits, once, into the run's storage (in memory, or
   spilled to scratch files for a large target, storage.py), θ_{t+1}'s softmax;
4. ``gather_evidence``: what is read off the raw logits: the calibration's evidence, the
   target's neighbourhoods, and the method's own (the default's vote-or-adapt choice);
5. ``make_targets``: the method's distillation targets (methods/: Eq. 3, 6-7, 10, 11-12, or
   the adaptive consensus);
6. ``fit``: distilled into θ_{t+1} or a student (Eq. 1-2), or as the method fits;
7. ``report``: the labels (the neighbour vote when the method votes), their calibration, and
   the result (report.py).

The target's ``y`` is never read. Each method is a registered object (registry.py,
methods/); the stages call its hooks and test no method names.
"""

from __future__ import annotations

import time

from torch import nn

from mrtf.device import pick_device
from mrtf.refinery import methods  # noqa: F401 - registers the built-in methods
from mrtf.refinery.config import METHOD_SPECS, METHODS, VARIANTS, RefineConfig
from mrtf.refinery.ensemble import ensemble_targets
from mrtf.refinery.input_reading import align_input
from mrtf.refinery.plan import check_fits, check_parties, newest_locals, plan_models
from mrtf.refinery.preview import PlanWatch, RefinePreview, preview_of
from mrtf.refinery.registry import get_method
from mrtf.refinery.report import RefineResult, accuracy_of, report
from mrtf.refinery.state import RefineState
from mrtf.refinery.storage import open_storage
from mrtf.refinery.teach import teach
from mrtf.refinery.teachers import predict_probs
from mrtf.refinery.trusted import attach_consensus, local_signals

__all__ = ["METHODS", "METHOD_SPECS", "VARIANTS", "PlanWatch", "RefineConfig", "RefinePreview",
           "RefineResult", "accuracy_of", "check_fits", "ensemble_targets", "newest_locals",
           "predict_probs", "preview", "refine"]


def refine(received, source, config: RefineConfig | None = None,
           student: nn.Module | None = None, watch: PlanWatch | None = None) -> RefineResult:
    """Refine received models on the unlabeled target ``source`` (H5Dataset or ArraySource).

    received : ReceivedSet (role 'local' models teach; role 'global' is θ_t).
    student : the model to refine when the parties' architectures differ (or to replace
        θ_{t+1} as the distillation start); must predict ``received.num_classes`` classes.
    watch : told the plan after the party checks (before the data pass) and the method's
        choice before the distillation (preview.py); watching changes no result.
    Same inputs and seed → identical results (bit for bit on the same machine).
    """
    watch = watch or PlanWatch()
    state = planned(received, source, config, student)
    config = state.config
    t0 = time.perf_counter()
    align_input(state)
    check_parties(state)
    watch.planned(preview_of(state))
    with open_storage(received, state.source, config) as state.storage:
        teach(state)
        state.timings["teachers"] = time.perf_counter() - t0
        if state.taught:
            gather_evidence(state)
        watch.chosen(state.method.choice(state))
        if state.taught:
            make_targets(state)
        state.logits = state.features = None  # free (K, M, C) before distilling
    fit(state)
    return report(state)


def preview(received, source, config: RefineConfig | None = None,
            student: nn.Module | None = None) -> tuple[RefinePreview, str]:
    """The plan :func:`refine` would follow and the method's choice, without the targets
    and the distillation: stages 1-4 (the party checks and the data pass), as ``mrtf
    inspect RECEIVED --data`` shows them."""
    state = planned(received, source, config, student)
    align_input(state)
    check_parties(state)
    with open_storage(received, state.source, state.config) as state.storage:
        teach(state)
        if state.taught:
            state.method.evidence(state)
        return preview_of(state), state.method.choice(state)


def planned(received, source, config: RefineConfig | None,
            student: nn.Module | None) -> RefineState:
    """Stage 1 for :func:`refine` and :func:`preview`: the config checked once, the state,
    and its plan of who teaches and who learns."""
    config = config or RefineConfig()
    config.validate()
    config.check_classes(received.num_classes)
    state = RefineState(received, source, config, get_method(config.method),
                        pick_device(config.device), student is not None)
    plan_models(state, student)
    return state


def gather_evidence(state: RefineState) -> None:
    """Stage 4: the calibration's evidence from the local models' logits and the target's
    neighbourhoods (timed as calibration), then the method's own reading (before the
    targets, which may write over the logits)."""
    t0 = time.perf_counter()
    state.signals = local_signals(state)
    state.neighbours = None if state.signals is None else state.signals.neighbours
    state.timings["calibration"] = time.perf_counter() - t0
    state.method.evidence(state)


def make_targets(state: RefineState) -> None:
    """Stage 5: the method's distillation targets; the calibration's evidence gets them as
    the consensus."""
    state.targets = state.method.targets(state)
    attach_consensus(state.signals, state.targets)


def fit(state: RefineState) -> None:
    """Stage 6: the refined model, as the method fits it (timed when there are teachers)."""
    t0 = time.perf_counter()
    state.model = state.method.fit(state)
    if state.taught:
        state.timings["distill"] = time.perf_counter() - t0
