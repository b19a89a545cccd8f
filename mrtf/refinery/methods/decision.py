"""decision: DECISION (Ahmed et al., CVPR 2021; mrtf/refinery/decision.py): every local
model adapted to the target, its head frozen, together with learned source weights α; the
targets are the α-weighted ensemble of the adapted models (δ(Σ_j α_j θ_j(x))).

The refined model (``result.model``, the ``--model`` file) is a student distilled to those
targets (Eq. 1-2, fit.py, ``--steps`` steps): with parties of one architecture and no student
given, it starts from the adapted model with the largest α (already close to the ensemble:
the distillation only carries the ensemble's extra accuracy into one network); otherwise
from the given student. The labels are the student's softmax, as for every distilling method;
``result.target_probs`` keeps the ensemble's own. Each source adapts on its own, so parties
of different architectures are fine (then a student is needed, as for every teaching method);
no parameter average is used.
"""

from __future__ import annotations

import copy
import time

import numpy as np
from torch import nn

from mrtf.errors import InputError
from mrtf.refinery.decision import DecisionSettings, decision_adapt
from mrtf.refinery.fit import distil_student
from mrtf.refinery.methods.base import Distilled
from mrtf.refinery.prior_diversity import with_class_shares
from mrtf.refinery.state import RefineState


class Decision(Distilled):
    name = "decision"
    summary = ("DECISION: every local model adapted to the target (head frozen) with learned "
               "source weights, the student distilled to their weighted ensemble (decision.py)")
    help = "every local model adapted to the target with learned source weights, DECISION"
    teachers = "locals"
    takes_class_frequencies = True  # its L_div aims at them (prior_diversity.py)

    #: the adapter's settings, its defaults (the paper's; decision.py states the cost choice);
    #: a run's own: ``RefineConfig.method_options``, read from ``config.options``
    settings = DecisionSettings()

    def choice(self, state: RefineState) -> str:
        return ("method decision: every local model adapted to the target with learned "
                "source weights, the student distilled to their weighted ensemble")

    def notes(self, state: RefineState) -> list[str]:
        """Refuses, before the data pass, a local model DECISION cannot adapt: one without
        an ``nn.Linear`` head or without trainable weights (an ONNX party only teaches)."""
        assert state.plan is not None
        for name, model in zip(state.plan.names, state.plan.locals_):
            params = list(model.parameters())
            heads = [m for m in model.modules() if isinstance(m, nn.Linear)]
            if not params or not heads:
                raise InputError(f"method decision adapts every local model, but {name} has "
                                 "no trainable nn.Linear classifier (an ONNX party can only "
                                 "teach); choose another --method")
        return []

    def targets(self, state: RefineState) -> np.ndarray:
        """Adapts copies of the local models (timed as 'decision'), keeps the start of the
        distillation, and notes the learned weights."""
        t0 = time.perf_counter()
        config = state.config
        settings = with_class_shares(config.options, config.class_shares)
        result = decision_adapt([copy.deepcopy(m) for m in state.teachers], state.source,
                                settings, config.seed, state.dev, config.progress)
        state.timings["decision"] = time.perf_counter() - t0
        best = int(np.argmax(result.alpha))
        plan = state.plan
        assert plan is not None
        if plan.agg is not None and not state.student_given:
            state.start_model = result.models[best]
        names = plan.names[:len(result.alpha)]
        top = np.argsort(-result.alpha, kind="stable")[:3]
        state.notes.append(
            f"decision: {result.epochs} epochs ({result.steps} steps) over "
            f"{len(result.alpha)} local models; largest source weights "
            + ", ".join(f"{names[i]} {result.alpha[i]:.3f}" for i in top)
            + f" (uniform {1 / len(result.alpha):.3f})")
        return result.probs.astype(np.float32)

    def start_model(self, state: RefineState) -> nn.Module:
        """The adapted model with the largest α, else the student (module docstring)."""
        if state.start_model is not None:
            return state.start_model
        assert state.plan is not None
        return state.plan.student

    def fit(self, state: RefineState) -> nn.Module:
        assert state.targets is not None
        return distil_student(self.start_model(state), state.source, state.targets,
                              state.config, state.dev)
