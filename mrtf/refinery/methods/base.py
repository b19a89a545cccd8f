"""What the distilling methods share: the student distilled to the method's targets (Eq. 1-2,
fit.py), and the paper's ensembles computed block by block (ensemble.py)."""

from __future__ import annotations

import numpy as np
from torch import nn

from mrtf.refinery.config import RefineConfig
from mrtf.refinery.fit import distil_student
from mrtf.refinery.registry import Method
from mrtf.refinery.state import RefineState


class Distilled(Method):
    """A method whose refined model is the student distilled to its targets."""

    def start_model(self, state: RefineState) -> nn.Module:
        """The model distillation starts from: θ_{t+1}'s copy, or the given student."""
        assert state.plan is not None
        return state.plan.student

    def fit(self, state: RefineState) -> nn.Module:
        assert state.targets is not None
        return distil_student(self.start_model(state), state.source, state.targets,
                              state.config, state.dev)


class Ensemble(Distilled):
    """A paper method: targets from the teachers' ensemble (:meth:`ensemble`)."""

    def ensemble(self, logits, num_local: int, config: RefineConfig, u: float | None
                 ) -> np.ndarray:
        """Targets (M, C) float32 from logits (K, M, C) (the local models first), block by
        block (ensemble.py)."""
        raise NotImplementedError

    def targets(self, state: RefineState) -> np.ndarray:
        return self.ensemble(state.logits.view, state.num_local, state.config, state.u)
