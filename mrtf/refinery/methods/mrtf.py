"""mrtf, the paper's MrTF: st+rd's targets (Eq. 10) refined by the clustered label refinery
(Eq. 11-12) on θ_{t+1}'s features, skipped for the models of the first rounds (Sect. 4.3)."""

from __future__ import annotations

import time

import numpy as np

from mrtf.compute.backend import choose_backend
from mrtf.refinery.cluster import prototype_targets
from mrtf.refinery.methods.st_rd import STRD
from mrtf.refinery.state import RefineState


def clr_skipped(state: RefineState) -> bool:
    """Whether the received models are of the first ``clr_min_round`` rounds (models without
    a round always get CLR)."""
    rounds = [m.meta.round for m in state.received.models if m.meta.round is not None]
    return bool(rounds) and max(rounds) < state.config.clr_min_round


class MrTF(STRD):
    name = "mrtf"
    summary = "+ clustered label refinery (Eq. 11-12): the paper's MrTF"
    help = "the paper: st+rd+clr"
    features = True

    def notes(self, state: RefineState) -> list[str]:
        if not clr_skipped(state):
            return []
        rounds = [m.meta.round for m in state.received.models if m.meta.round is not None]
        # rounds are 0-based in memory and counted from 1 on screen and in files
        return [f"round {max(rounds) + 1} is within the first {state.config.clr_min_round} "
                "rounds (--clr-min-round): clustered label refinery skipped"]

    def wants_features(self, state: RefineState) -> bool:
        return not clr_skipped(state)

    def targets(self, state: RefineState) -> np.ndarray:
        targets = super().targets(state)
        config = state.config
        if clr_skipped(state) or config.clr_iterations == 0:
            return targets
        t0 = time.perf_counter()
        # on the refine's device (--device): CUDA's presence alone does not move CLR there
        refined = prototype_targets(targets, state.features, config.tau,
                                    config.clr_iterations, config.variant,
                                    backend=choose_backend(state.dev))
        state.timings["clr"] = time.perf_counter() - t0
        return refined

