"""st+rd: stabilized teachers plus rectified distillation (Eq. 10): the local models'
entropy-weighted ensemble mixed with the self-teachers θ_t and θ_{t+1} by u_t."""

from __future__ import annotations

import numpy as np

from mrtf.refinery.config import RefineConfig
from mrtf.refinery.ensemble import stabilized_targets
from mrtf.refinery.methods.base import Ensemble
from mrtf.refinery.rectify import rectified_targets


class STRD(Ensemble):
    name = "st+rd"
    summary = "+ rectified distillation (Eq. 10)"
    teachers = "all"
    uses_u_t = True

    def ensemble(self, logits, num_local: int, config: RefineConfig, u: float | None
                 ) -> np.ndarray:
        assert u is not None
        # [θ_t, θ_{t+1}] or [θ_{t+1}] or [student] follow the local models
        return stabilized_targets(logits, config, lambda q: rectified_targets(
            q[:num_local], q[num_local], q[-1], u, config.variant))

