"""fedavg: θ_{t+1}, the parameter average, as it is (no teachers, no refinement)."""

from __future__ import annotations

from torch import nn

from mrtf.refinery.registry import Method
from mrtf.refinery.state import RefineState


class FedAvg(Method):
    name = "fedavg"
    summary = "θ_{t+1}, the parameter average, no refinement"
    help = "average only"
    teachers = "none"

    def choice(self, state: RefineState) -> str:
        return "method fedavg: θ_{t+1} as it is, no distillation"

    def fit(self, state: RefineState) -> nn.Module:
        return state.self_model.eval()

