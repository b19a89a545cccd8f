"""aad: θ_{t+1} adapted to the target by AaD, attracting and dispersing (Yang et al., NeurIPS
2022; mrtf/refinery/aad.py, the authors' VisDA settings, lr 0.01); no teachers, the labels are
the adapted model's argmax."""

from __future__ import annotations

from torch import nn

from mrtf.refinery.aad import AadSettings, aad_adapt
from mrtf.refinery.methods.source_free import SourceFree
from mrtf.refinery.state import RefineState


class Aad(SourceFree):
    name = "aad"
    summary = "θ_{t+1} adapted by AaD, neighbours attract, the batch disperses (aad.py)"
    help = "θ_{t+1} adapted by AaD"
    settings: AadSettings = AadSettings()

    def adapt(self, model: nn.Module, state: RefineState) -> nn.Module:
        config = state.config
        return aad_adapt(model, state.source, config.options, config.seed, state.dev,
                         config.progress)
