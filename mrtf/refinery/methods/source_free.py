"""What the source-free adaptation methods share (shot.py, aad.py, nrc.py here): no teachers;
θ_{t+1} (its copy, or the given student) adapted to the unlabeled target by the method's own
adapter and recipe; the labels are the adapted model's argmax (report.py)."""

from __future__ import annotations

import time
from typing import Any

from torch import nn

from mrtf.refinery.registry import Method
from mrtf.refinery.state import RefineState


class SourceFree(Method):
    """A method that adapts θ_{t+1} to the target without teachers.

    ``settings`` : the adapter's frozen settings; the class attribute is the method's recipe,
    its defaults. One run's own are ``RefineConfig(method_options=...)`` (``mrtf refine
    --option KEY=VALUE``), read by :meth:`adapt` from ``state.config.options``; a named
    variant is one more registered instance, e.g.
    ``register_method(Aad(AadSettings(k=3), name="aad-k3"))``.
    """

    teachers = "none"

    def __init__(self, settings: Any = None, name: str | None = None) -> None:
        if settings is not None:
            self.settings = settings
        if name is not None:
            self.name = name

    def adapt(self, model: nn.Module, state: RefineState) -> nn.Module:
        """``model`` adapted to ``state.source`` (in place or not); the method's adapter."""
        raise NotImplementedError

    def notes(self, state: RefineState) -> list[str]:
        return [f"{self.name}: {state.config.options}; --steps, --batch-size and --lr do not "
                "apply"]

    def choice(self, state: RefineState) -> str:
        return f"method {self.name}: θ_{{t+1}} adapted to the target, no teachers"

    def fit(self, state: RefineState) -> nn.Module:
        """θ_{t+1}'s copy (or the given student) adapted, timed as 'distill' (the fit stage)."""
        assert state.plan is not None
        t0 = time.perf_counter()
        model = self.adapt(state.plan.student, state)
        state.timings["distill"] = time.perf_counter() - t0
        return model
