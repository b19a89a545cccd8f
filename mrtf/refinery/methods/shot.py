"""shot: θ_{t+1} adapted to the target by SHOT (Liang, Hu & Feng, ICML 2020) with SHOT's own
digit recipe (shot.py, ``ShotSettings.paper()``: SGD 0.01 with its decay, 30 epochs of batch 64,
β 0.1, the head frozen); no teachers, the labels are the adapted model's argmax."""

from __future__ import annotations

from torch import nn

from mrtf.refinery.methods.source_free import SourceFree
from mrtf.refinery.prior_diversity import with_class_shares
from mrtf.refinery.shot import ShotSettings, shot_adapt
from mrtf.refinery.state import RefineState


class Shot(SourceFree):
    name = "shot"
    summary = "θ_{t+1} adapted by SHOT with the paper's recipe (shot.py); no teachers"
    help = "θ_{t+1} adapted by SHOT, the paper's recipe"
    takes_class_frequencies = True  # its diversity term aims at them (prior_diversity.py)
    settings: ShotSettings = ShotSettings.paper()

    def adapt(self, model: nn.Module, state: RefineState) -> nn.Module:
        config = state.config
        settings = with_class_shares(config.options, config.class_shares)
        return shot_adapt(model, state.source, settings, config.seed, state.dev,
                          config.progress, state.spilled, config.scratch_dir)
