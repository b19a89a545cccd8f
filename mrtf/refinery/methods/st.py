"""st: the local models' stabilized AvgProb as the targets (Eq. 6-7)."""

from __future__ import annotations

import numpy as np

from mrtf.refinery.config import RefineConfig
from mrtf.refinery.ensemble import stabilized_targets
from mrtf.refinery.methods.base import Ensemble
from mrtf.refinery.teachers import avg_prob


class ST(Ensemble):
    name = "st"
    summary = "stabilized AvgProb targets (Eq. 6-7)"
    teachers = "locals"

    def ensemble(self, logits, num_local: int, config: RefineConfig, u: float | None
                 ) -> np.ndarray:
        return stabilized_targets(logits, config, lambda q: avg_prob(q[:num_local]))

