"""How the student is fitted to the target: distilled to the consensus (Eq. 1-2), or θ_{t+1}
adapted to the target with SHOT and then settled: distilled to its own neighbour vote with its
inputs jittered, as the vote branch's last steps do. Which of the two the adaptive default
keeps is branch_choice.py's; where the adapt branch starts, adapt_start.py's."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from mrtf.models import has_batchnorm
from mrtf.refinery.adapt_start import AVERAGE, VOTE_STUDENT, StartChoice, choose_start
from mrtf.refinery.config import RefineConfig
from mrtf.refinery.distill import distill
from mrtf.refinery.neighbour_vote import NeighbourVote, final_probs
from mrtf.refinery.shot import ShotSettings, shot_adapt

#: the adapt branch's cap on SHOT's steps: SHOT's 30 passes over a 10,000-image target
#: (4,710 steps of 64) fit under it; a larger target gets fewer passes, so one refine stays
#: bounded in time
ADAPT_MAX_STEPS = 5000
#: rounds of (neighbour vote, distillation) that settle an adapted network with BatchNorm
#: (:func:`settle_rounds`); one round for a network without
SETTLE_ROUNDS = 3


@dataclass(frozen=True)
class AdaptSchedule:
    """How :func:`adapt_student` adapts a model and settles it.

    min_rounds : at least this many settling rounds (:func:`settle_rounds` gives the
        model's own count).
    settle_share : each settling round distils for this share of ``config.steps``.
    max_refreshes : SHOT refreshes its pseudo-labels at most this many times in its run
        (0: once per pass over the target, SHOT's)."""

    min_rounds: int = 1
    settle_share: float = 1.0
    max_refreshes: int = 0


#: the vote's student adapted (the adaptive default's option adapt_vote): at least two
#: settling rounds (the second gained on the standard digits), each of half the steps, and
#: SHOT's labels refreshed at most four times: nearly the accuracy of full rounds refreshed
#: every pass, in less time (the numbers: docs/benchmarks/label-quality.md, "The option
#: adapt_vote" and "Cheaper")
VOTE_SCHEDULE = AdaptSchedule(min_rounds=2, settle_share=0.5, max_refreshes=4)


def adapt_settings(model: nn.Module, config: RefineConfig) -> ShotSettings:
    """The adapt branch's SHOT, by the model it adapts.

    A model with BatchNorm (SHOT's own source network: bottleneck + BatchNorm + weight-
    normalised head, ``lenet_shot``) gets SHOT's digit recipe (ShotSettings.paper: SGD 0.01
    with its decay, 30 passes of batch 64, β 0.1), capped at :data:`ADAPT_MAX_STEPS`: on the
    standard digits with ten such parties (Dirichlet 0.5, one-shot, seed 0) adapting θ_{t+1}
    with it gave 0.910 / 0.982 (MNIST → USPS / USPS → MNIST) against 0.879 / 0.914 with the
    project's settings. A model without (the plain LeNet of the label-quality grid) keeps the
    project's: Adam 3e-5 for ``config.steps``: there SHOT's recipe was worse on every
    mnist5k → mnistm5k set (0.536 / 0.493 / 0.482 against 0.562 / 0.533 / 0.520, seeds 0-2;
    SGD at 0.01 over every weight of a network without BatchNorm moves it too far). Both
    were chosen on those runs (in-sample; docs/benchmarks/standard-digits.md). Either pulls
    the mean prediction to the target's class shares where the user gave them
    (``config.class_frequencies``), else to an even spread."""
    if has_batchnorm(model):
        return replace(ShotSettings.paper(), max_steps=ADAPT_MAX_STEPS,
                       class_prior=config.class_shares)
    return ShotSettings(steps=config.steps, batch_size=config.batch_size,
                        class_prior=config.class_shares)


def distil_student(student: nn.Module, source, targets: np.ndarray, config: RefineConfig,
                   dev: torch.device) -> nn.Module:
    """The vote branch: ``student`` distilled to ``targets`` (Eq. 1-2), in place."""
    return distill(student, source, targets, config.distill_run(), dev, config.progress)


def adapt_student(student: nn.Module, source, config: RefineConfig, dev: torch.device,
                  streaming: bool = False, schedule: AdaptSchedule = AdaptSchedule()
                  ) -> nn.Module:
    """The adapt branch: ``student`` (θ_{t+1}) adapted to the target with SHOT
    (:func:`adapt_settings`, by the model, its refreshes capped as ``schedule`` says; over
    spilled storage SHOT keeps its features in a scratch file in ``config.scratch_dir``),
    then settled (:func:`settle`, as ``schedule`` says). In place."""
    settings = refreshed_at_most(adapt_settings(student, config), len(source),
                                 schedule.max_refreshes)
    adapted = shot_adapt(student, source, settings, config.seed, dev, config.progress,
                         streaming, config.scratch_dir)
    return settle(adapted, source, config, dev, schedule)


def refreshed_at_most(settings: ShotSettings, m: int, refreshes: int) -> ShotSettings:
    """``settings`` refreshing SHOT's pseudo-labels at most ``refreshes`` times on a target
    of m samples: every pass, or every 1 / ``refreshes`` of the run where passes are more
    (a small target: 32 passes in 500 steps on 1,000 samples); unchanged for 0."""
    if refreshes <= 0:
        return settings
    every = max(settings.refresh_interval(m), math.ceil(settings.num_steps(m) / refreshes))
    return replace(settings, refresh_every=every)


def settle_rounds(model: nn.Module) -> int:
    """How many rounds :func:`settle` runs: :data:`SETTLE_ROUNDS` for a network with BatchNorm
    (adapted with SHOT's recipe, :func:`adapt_settings`), one for a network without.

    More rounds gained on every BatchNorm network measured, and not on the grid's lightly
    adapted plain LeNets; the count was chosen on one set and checked on the others (in-
    sample; the numbers: docs/benchmarks/standard-digits.md, "Settling in rounds")."""
    return SETTLE_ROUNDS if has_batchnorm(model) else 1


def settle(adapted: nn.Module, source, config: RefineConfig, dev: torch.device,
           schedule: AdaptSchedule = AdaptSchedule()) -> nn.Module:
    """After SHOT, the vote branch's last two steps, :func:`settle_rounds` times: the adapted
    model is distilled to its own neighbour vote with its inputs jittered (steps 6-7 of README
    "How adaptive works"), and the next round votes with the model the last one distilled.
    SHOT fits without the jitter, so its labels keep the noise the jitter smooths out on the
    vote branch; each round's vote is taken in features the previous round made smoother, so
    it corrects labels the first vote could not (docs/benchmarks/standard-digits.md); at
    least ``schedule.min_rounds`` rounds, each of ``schedule.settle_share`` of the steps."""
    if config.jitter is None or config.vote_k < 1:
        return adapted
    if schedule.settle_share != 1.0:
        config = replace(config, steps=max(1, round(config.steps * schedule.settle_share)))
    for r in range(max(settle_rounds(adapted), schedule.min_rounds)):
        voted, _ = final_probs(adapted, source, config.vote_k, config.inference_batch, dev,
                               config.stack)
        adapted = distill(adapted, source, voted.astype(np.float32),
                          config.distill_run(seed_offset=1000 * (r + 1)), dev, config.progress)
    return adapted


def adapts_from_both_starts(model: nn.Module, num_local: int) -> bool:
    """Whether the adapt branch adapts both θ_{t+1} and the vote's student
    (:func:`adapt_both_starts`): with more than one party (one party's vote is θ_{t+1}'s own
    opinion) and a network with BatchNorm, which SHOT's recipe adapts until its labels are
    sure (:func:`adapt_settings`). A plain network, adapted lightly (Adam 3e-5), keeps much
    of its start's doubt, so the information of its labels measures the start more than the
    adaptation: on the label-quality grid's mnist5k → mnistm5k sets (four plain LeNets, seeds
    0-2) the student's labels scored the higher information on all three and were worse on
    two (0.425 / 0.509 against 0.515 / 0.533; docs/benchmarks/standard-digits.md)."""
    return num_local > 1 and has_batchnorm(model)


@dataclass(frozen=True)
class KeptStart:
    """The adapt branch from both starts: the kept ``model``, the ``choice`` and the kept
    model's ``labels`` (neighbour_vote.final_probs: probabilities and vote), which the report
    reuses instead of voting again; ``voted``: the vote's student as distilled, before SHOT
    (what the vote branch would give), for an adaptation that merged classes
    (branch_choice.collapsed_adaptation)."""

    model: nn.Module
    choice: StartChoice
    labels: tuple[np.ndarray, NeighbourVote | None]
    voted: nn.Module


def adapt_both_starts(average: nn.Module, source, targets: np.ndarray, config: RefineConfig,
                      dev: torch.device, streaming: bool = False) -> KeptStart:
    """The adapt branch with a vote to distil (more than one party): ``average`` (θ_{t+1})
    adapted as it is, and a copy of it first distilled to ``targets`` (the vote's student)
    then adapted; the one whose labels (after the neighbour vote) carry more information
    about the target, and are no less diverse, is kept (adapt_start.py), with the choice,
    its labels and the vote's student before SHOT. ``average`` is adapted in place."""
    student = distil_student(copy.deepcopy(average), source, targets, config, dev)
    voted = copy.deepcopy(student)  # SHOT adapts the student in place
    adapted = {AVERAGE: adapt_student(average, source, config, dev, streaming),
               VOTE_STUDENT: adapt_student(student, source, config, dev, streaming)}
    labels = {name: final_probs(model, source, config.vote_k, config.inference_batch, dev,
                                config.stack) for name, model in adapted.items()}
    choice = choose_start({name: out[0] for name, out in labels.items()})
    return KeptStart(adapted[choice.kept], choice, labels[choice.kept], voted)
