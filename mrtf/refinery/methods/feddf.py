"""feddf: the local models' AvgLogit as the targets (Eq. 3; FedDF Eq. 1)."""

from __future__ import annotations

import numpy as np

from mrtf.refinery.config import RefineConfig
from mrtf.refinery.ensemble import logit_targets
from mrtf.refinery.methods.base import Ensemble
from mrtf.refinery.teachers import avg_logit


class FedDF(Ensemble):
    name = "feddf"
    summary = "AvgLogit targets (Eq. 3)"
    help = "AvgLogit"
    teachers = "locals"

    def ensemble(self, logits, num_local: int, config: RefineConfig, u: float | None
                 ) -> np.ndarray:
        return logit_targets(logits, num_local, avg_logit)

