"""shot: θ_{t+1} adapted to the target by SHOT (Liang, Hu & Feng, ICML 2020) with SHOT's own
digit recipe (shot.py, ``ShotSettings.paper()``: SGD 0.01 with its decay, 30 epochs of batch 64,
β 0.1, the head frozen); no teachers, the labels are the adapted model's argmax."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from mrtf.refinery.methods.source_free import SourceFree
from mrtf.refinery.shot import ShotSettings, shot_adapt
from mrtf.refinery.state import RefineState


class Shot(SourceFree):
    name = "shot"
    summary = "θ_{t+1} adapted by SHOT with the paper's recipe (shot.py); no teachers"
    help = "θ_{t+1} adapted by SHOT, the paper's recipe"
    settings: ShotSettings = ShotSettings.paper()

    def adapt(self, model: nn.Module, state: RefineState) -> nn.Module:
        config = state.config
        settings = config.options  # its diversity term aimed at the given class shares
        if config.class_shares is not None:
            settings = replace(settings, class_prior=config.class_shares)
        return shot_adapt(model, state.source, settings, config.seed, state.dev,
                          config.progress, state.spilled, config.scratch_dir)
