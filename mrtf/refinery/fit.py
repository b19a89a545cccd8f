"""How the student is fitted to the target: distilled to the consensus (Eq. 1-2), or, when the
target is new to the parties (novelty.py), θ_{t+1} adapted with SHOT and then settled: distilled
to its own neighbour vote with its inputs jittered, as the vote branch's last steps do."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mrtf.refinery.config import RefineConfig
from mrtf.refinery.distill import distill
from mrtf.refinery.neighbour_vote import final_probs
from mrtf.refinery.novelty import Novelty
from mrtf.refinery.shot import ShotSettings, shot_adapt


def fit_student(student: nn.Module, source, targets: np.ndarray, config: RefineConfig,
                dev: torch.device, novelty: Novelty | None, streaming: bool = False) -> nn.Module:
    """Distil ``targets`` into ``student`` (Eq. 1-2), or, when the target is new to the
    parties, adapt it to the target with SHOT under the same step budget and settle it
    (novelty.py, :func:`settle`; over spilled storage SHOT keeps its features in a scratch file in
    ``config.scratch_dir``)."""
    if novelty is not None and novelty.adapt:
        adapted = shot_adapt(student, source, ShotSettings(steps=config.steps,
                                                           batch_size=config.batch_size),
                             config.seed, dev, config.progress, streaming, config.scratch_dir)
        return settle(adapted, source, config, dev)
    return distill(student, source, targets, config.distill_run(), dev, config.progress)


def settle(adapted: nn.Module, source, config: RefineConfig, dev: torch.device) -> nn.Module:
    """After SHOT, the vote branch's last two steps: the adapted model is distilled to its own
    neighbour vote with its inputs jittered (steps 6-7 of README "How adaptive works"). SHOT
    fits without the jitter, so its labels keep the noise the jitter smooths out on the vote
    branch: +1.2 points on 23 adapted sets, better in 17, worse in 4 (bench/second_round.py)."""
    if config.jitter is None or config.vote_k < 1:
        return adapted
    voted, _ = final_probs(adapted, source, config.vote_k, config.inference_batch, dev,
                           config.stack)
    return distill(adapted, source, voted.astype(np.float32), config.distill_run(seed_offset=1000),
                   dev, config.progress)
