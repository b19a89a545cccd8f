"""nrc: θ_{t+1} adapted to the target by NRC, reciprocal and expanded neighbourhoods (Yang et
al., NeurIPS 2021; mrtf/refinery/nrc.py, the authors' VisDA settings, lr 0.01); no teachers,
the labels are the adapted model's argmax."""

from __future__ import annotations

from torch import nn

from mrtf.refinery.methods.source_free import SourceFree
from mrtf.refinery.nrc import NrcSettings, nrc_adapt
from mrtf.refinery.prior_diversity import with_class_shares
from mrtf.refinery.state import RefineState


class Nrc(SourceFree):
    name = "nrc"
    summary = "θ_{t+1} adapted by NRC, reciprocal + expanded neighbours (nrc.py)"
    help = "θ_{t+1} adapted by NRC"
    takes_class_frequencies = True  # its L_div aims at them (prior_diversity.py)
    settings: NrcSettings = NrcSettings()

    def adapt(self, model: nn.Module, state: RefineState) -> nn.Module:
        config = state.config
        settings = with_class_shares(config.options, config.class_shares)
        return nrc_adapt(model, state.source, settings, config.seed, state.dev,
                         config.progress)
