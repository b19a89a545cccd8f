"""NRC: neighbourhood reciprocity clustering (Yang, Wang, van de Weijer, Herranz & Jui,
"Exploiting the Intrinsic Neighborhood Structure for Source-free Domain Adaptation",
NeurIPS 2021).

Each sample's softmax p_i is pulled towards the banked scores S of its K nearest neighbours,
with affinity A_ik = 1 when the neighbour k has i among its own KK nearest (reciprocal) and
r otherwise (L_N), and towards the scores of its neighbours' KK nearest neighbours, the
expanded neighbourhood, with affinity r (L_E); a diversity term keeps the mean prediction
p̄ away from one class (L_div = KL(p̄ ‖ uniform), up to its constant log C; KL(p̄ ‖ π) when
the user gave the target's class shares π, ``NrcSettings.class_prior``, prior_diversity.py).
In the paper's notation (its PDF was not at hand here, so its terms are named, not numbered):

    L = L_div + L_N + L_E,
    L_N = −mean_i Σ_{k∈N_K(i)} A_ik S_k·p_i,   L_E = −mean_i Σ_{k∈N_K(i)} Σ_{m∈E_KK(k)} r S_m·p_i.

As the authors' code (``Albert0147/NRC_SFDA`` train_tar.py) does, there is no separate
self-regularisation term L_self: the sample itself is left in the expanded neighbourhood, where
it appears, with affinity r, once for each neighbour that has it among its nearest (the
README: "the occurrence frequency of self feature acts as a dynamic weight").

The code as PyTorch runs it differs from the paper in one more place: it fills the expanded
neighbours' weights in place through ``weight.unsqueeze(-1).expand(...)``, a view of the
reciprocal weights, so these become r too and every one of the K neighbours gets affinity r.
The default, ``mutual = 0.1``, is the code as run (as far as can be told here, the code the
paper's numbers come from);
``NrcSettings(mutual=1.0)`` is the paper's A_ik. In-sample note: this was found reading the
code after NRC with the paper's A_ik stayed ~6 points below AaD on MNIST→USPS (seeds 0-2,
0.852-0.863; as run: docs/benchmarks/source-free.md).

Settings (:class:`NrcSettings`): the method's constants are the code's VisDA defaults (K 5,
KK 5, r 0.1, ε 1e-5, batch 64, SGD + SHOT's schedule; the paper has no digit experiment); the
schedule's length and rate are SHOT's digit recipe, lr 0.01 for the whole network and 30
epochs (aad.py says why, and that 30 epochs was set after an in-sample run). The
banks, neighbours and schedule are neighbourhood.py's. The target's ``y`` is never read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from mrtf.errors import InputError
from mrtf.refinery.neighbourhood import (
    Banks,
    adapt_with_banks,
    attraction,
    check_recipe,
    classifier_head,
    nearest,
)
from mrtf.refinery.prior_diversity import (
    PRIOR_RULE,
    check_prior_classes,
    mean_diversity,
    valid_prior,
)
from mrtf.schedule import epoch_steps


@dataclass(frozen=True)
class NrcSettings:
    """NRC's settings (defaults: the authors' VisDA code; lr: see the module's note).

    k : neighbours per sample, N_K (``--K 5``). kk : neighbours of each neighbour, E_KK, also
    the reciprocity test's (``--KK 5``). r : the affinity of non-reciprocal and expanded
    neighbours (0.1). mutual : the affinity of reciprocal neighbours (the authors' code as it
    runs: 0.1, the default; the paper: 1; see the module's note). eps : inside log p̄
    (``--epsilon 1e-5``). epochs, batch_size : SHOT's digit 30 (the VisDA code's
    ``--max_epoch 15``), ``--batch_size 64``. lr : SGD's initial learning rate for every
    parameter (SHOT's digit 0.01). class_prior : the target's class shares π (summing to 1)
    when the user gave them (``refine --class-frequencies``): L_div is KL(p̄ ‖ π) where NRC's
    is KL(p̄ ‖ uniform) less log C; None (default): NRC's. Not an ``--option``: refine sets it
    from the frequencies.
    """

    k: int = 5
    kk: int = 5
    r: float = 0.1
    mutual: float = 0.1
    eps: float = 1e-5
    epochs: int = 30
    batch_size: int = 64
    lr: float = 0.01
    class_prior: tuple[float, ...] | None = field(default=None, metadata={"option": False})

    def num_steps(self, m: int) -> int:
        return epoch_steps(self.epochs, self.batch_size, m)

    def validate(self) -> None:
        check_recipe("NRC", self)
        for ok, msg in [(self.k >= 1 and self.kk >= 1,
                         f"k and kk must be >= 1, got {self.k} and {self.kk}"),
                        (0 <= self.r < math.inf and 0 <= self.mutual < math.inf,
                         f"r and mutual must be finite and >= 0, got {self.r} and {self.mutual}"),
                        (0 < self.eps < math.inf, f"eps must be finite and > 0, got {self.eps}"),
                        (valid_prior(self.class_prior), PRIOR_RULE)]:
            if not ok:
                raise InputError(f"NRC: {msg}")


def reciprocal_affinity(rows: torch.Tensor, neighbours_of_neighbours: torch.Tensor, r: float,
                        mutual: float = 1.0) -> torch.Tensor:
    """A_ik (B, K): ``mutual`` (the paper: 1) where neighbour k of sample ``rows[i]`` has it
    among its own KK nearest (``neighbours_of_neighbours`` (B, K, KK)), else ``r``."""
    is_mutual = (neighbours_of_neighbours == rows.view(-1, 1, 1)).any(-1)
    return torch.where(is_mutual, mutual, r).to(torch.float32)


def diversity(probs: torch.Tensor, eps: float = 1e-5,
              prior: tuple[float, ...] | None = None) -> torch.Tensor:
    """L_div: Σ_c p̄_c log(p̄_c + ε), p̄ the batch's mean softmax (B, C); KL(p̄ ‖ uniform) less
    its constant log C. With the target's class shares ``prior`` π: Σ_c p̄_c log((p̄_c + ε) /
    π_c), KL(p̄ ‖ π), smallest at p̄ = π rather than at the even spread NRC assumes."""
    return mean_diversity(probs.mean(0), eps, prior)


def nrc_loss(probs: torch.Tensor, near_scores: torch.Tensor, affinity: torch.Tensor,
             expanded_scores: torch.Tensor, settings: NrcSettings) -> torch.Tensor:
    """L = L_div + L_N + L_E: probs (B, C), the neighbours' banked scores (B, K, C) and their
    affinity (B, K), the expanded neighbours' scores (B, K·KK, C), each with affinity r."""
    expanded = torch.full(expanded_scores.shape[:2], settings.r, device=probs.device)
    return (diversity(probs, settings.eps, settings.class_prior)
            + attraction(probs, near_scores, affinity)
            + attraction(probs, expanded_scores, expanded))


def expanded_neighbours(banks: Banks, near: torch.Tensor, kk: int) -> torch.Tensor:
    """E_KK(k) for every neighbour k of every sample: (B, K, KK), each neighbour itself left
    out (the sample whose neighbour it is may be among them)."""
    flat = near.reshape(-1)
    return nearest(banks.features[flat], banks.features, kk, flat).view(*near.shape, kk)


def nrc_objective(settings: NrcSettings):
    """The loss of one batch as neighbourhood.adapt_with_banks calls it."""
    def objective(probs: torch.Tensor, rows: torch.Tensor, banks: Banks, progress: float
                  ) -> torch.Tensor:
        m = len(banks.features)
        near = banks.neighbours(rows, min(settings.k, m - 1))
        near_near = expanded_neighbours(banks, near, min(settings.kk, m - 1))
        affinity = reciprocal_affinity(rows, near_near, settings.r, settings.mutual)
        expanded = banks.scores[near_near].flatten(1, 2)
        return nrc_loss(probs, banks.scores[near], affinity, expanded, settings)
    return objective


def nrc_adapt(model: nn.Module, source, settings: NrcSettings | None = None, seed: int = 0,
              device: torch.device | str | None = None, progress: bool = False) -> nn.Module:
    """Adapt ``model`` in place (no copy) to the unlabeled ``source`` (H5Dataset/ArraySource)
    with NRC; returned in eval mode on the device it came on. Deterministic given ``seed``.
    InputError (one line) when ``settings.class_prior`` does not give one share per class."""
    cfg = settings or NrcSettings()
    cfg.validate()
    check_prior_classes("NRC", cfg.class_prior, classifier_head(model, "NRC").out_features)
    return adapt_with_banks(model, source, nrc_objective(cfg), cfg, seed, device, progress,
                            "NRC")
