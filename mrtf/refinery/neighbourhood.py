"""What the neighbourhood-clustering adapters share: NRC (Yang et al., "Exploiting the Intrinsic
Neighborhood Structure for Source-free Domain Adaptation", NeurIPS 2021; nrc.py) and AaD (Yang
et al., "Attracting and Dispersing: A Simple Approach for Source-free Domain Adaptation",
NeurIPS 2022; aad.py). Both adapt one source model to the unlabeled target by making each
sample's prediction agree with those of its nearest neighbours in feature space.

As the authors' code does (``Albert0147/NRC_SFDA`` train_tar.py, ``Albert0147/AaD_SFDA``
tar_adaptation.py; read, not copied):

* two memory banks over the whole target (:class:`Banks`): the L2-normalised features (the
  input of the classifier, the last ``nn.Linear``, taken with a forward pre-hook as shot.py
  does) and the softmax scores, filled by one pass in eval mode; each training batch then
  writes its own rows (train-mode features and scores, detached) before its neighbours are
  looked up;
* neighbours by cosine similarity over the feature bank, the sample itself left out
  (:func:`nearest`; the code takes the top K + 1 and drops the first, the same when no two
  samples share a feature vector);
* the training schedule, SHOT's scaffolding that both codes keep: SGD, momentum 0.9, Nesterov,
  weight decay 1e-3, lr·(1 + 10·i/N)^−0.75 (mrtf/schedule.py), every parameter trained, the
  classifier included (unlike SHOT), the network in train mode (:func:`adapt_with_banks`).

The target's ``y`` is never read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from mrtf.device import pick_device
from mrtf.errors import FusionError, InputError
from mrtf.io.read_ahead import source_chunks
from mrtf.refinery.distill import _batches, gather_rows
from mrtf.schedule import anneal, shot_sgd

_CHUNK = 1024  # rows per inference chunk of the bank pass
_QUERY_BLOCK = 128  # queries per similarity block of nearest()


class Recipe(Protocol):
    """The schedule part of an adapter's settings (aad.AadSettings, nrc.NrcSettings)."""

    epochs: int
    batch_size: int
    lr: float

    def num_steps(self, m: int) -> int: ...


def check_recipe(name: str, recipe: Recipe) -> None:
    """One clear line for a bad schedule (``not ok`` also rejects NaN)."""
    for ok, msg in [(recipe.epochs >= 0, f"epochs must be >= 0, got {recipe.epochs}"),
                    (recipe.batch_size >= 2, f"batch_size must be >= 2, got {recipe.batch_size}"),
                    (0 < recipe.lr < math.inf, f"lr must be a finite number > 0, got {recipe.lr}")]:
        if not ok:
            raise InputError(f"{name}: {msg}")


def classifier_head(model: nn.Module, name: str) -> nn.Linear:
    """The classifier: the last ``nn.Linear`` registered (the project's rule for user models,
    mrtf.models.custom); its input is the feature the neighbours are found in."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise InputError(f"{name} needs a model whose classifier is an nn.Linear (none found)")
    return linears[-1]


def nearest(queries: torch.Tensor, bank: torch.Tensor, k: int, exclude: torch.Tensor
            ) -> torch.Tensor:
    """Indices (B, k) of the ``k`` bank rows most similar (dot product: cosine for
    L2-normalised rows) to each query (B, D); bank row ``exclude[b]`` (the query itself) is
    never one of query b's. Queries go in blocks of :data:`_QUERY_BLOCK`: a (block, M)
    similarity matrix at a time."""
    out = []
    for s in range(0, len(queries), _QUERY_BLOCK):
        sim = queries[s:s + _QUERY_BLOCK] @ bank.T
        sim.scatter_(1, exclude[s:s + _QUERY_BLOCK].view(-1, 1), -math.inf)
        out.append(sim.topk(k, dim=1).indices)
    return torch.cat(out)


def attraction(probs: torch.Tensor, neighbour_scores: torch.Tensor,
               weights: torch.Tensor | None = None) -> torch.Tensor:
    """−mean_i Σ_k w_ik · p_i·s_k: probs (B, C), neighbour_scores (B, K, C) from the score bank
    (constants), weights (B, K) (None: all 1). AaD's attracting term and NRC's L_N / L_E (the
    codes write it as a KL divergence with an unlogged input, which has this gradient)."""
    dots = (probs.unsqueeze(1) * neighbour_scores).sum(-1)
    if weights is not None:
        dots = dots * weights
    return -dots.sum(1).mean()


@dataclass
class Banks:
    """The target's memory banks: ``features`` (M, D) L2-normalised, ``scores`` (M, C)."""

    features: torch.Tensor
    scores: torch.Tensor

    def write(self, rows: torch.Tensor, features: torch.Tensor, scores: torch.Tensor) -> None:
        """Rows ``rows`` replaced by a batch's features (normalised here) and scores."""
        self.features[rows] = F.normalize(features.detach(), dim=1)
        self.scores[rows] = scores.detach()

    def neighbours(self, rows: torch.Tensor, k: int) -> torch.Tensor:
        """The ``k`` nearest bank rows (B, k) of bank rows ``rows`` (B,), themselves left out."""
        return nearest(self.features[rows], self.features, k, rows)


#: (batch softmax (B, C), the batch's bank rows (B,), the banks, i/N) -> the loss
Objective = Callable[[torch.Tensor, torch.Tensor, Banks, float], torch.Tensor]


class _Features:
    """The classifier's input of the last forward, from a forward pre-hook."""

    def __init__(self, head: nn.Linear) -> None:
        self.last: torch.Tensor | None = None
        self._hook = head.register_forward_pre_hook(self._keep)

    def _keep(self, _module: nn.Module, inputs: tuple) -> None:
        self.last = inputs[0].flatten(1)

    def take(self) -> torch.Tensor:
        assert self.last is not None
        out, self.last = self.last, None
        return out

    def remove(self) -> None:
        self._hook.remove()


@torch.no_grad()
def fill_banks(model: nn.Module, source, features: _Features, dev: torch.device) -> Banks:
    """The banks over the whole ``source``, streamed, in eval mode (as the codes fill them)."""
    model.eval()
    m = len(source)
    banks: Banks | None = None
    for start, x in source_chunks(source, _CHUNK, dev):  # on CUDA: the next chunk read meanwhile
        p = F.softmax(model(torch.from_numpy(np.ascontiguousarray(x)).to(dev)).float(), 1)
        h = features.take().float()
        if not (torch.isfinite(p).all() and torch.isfinite(h).all()):
            raise FusionError("the model's predictions or features are not finite")
        if banks is None:
            banks = Banks(torch.zeros(m, h.shape[1], device=dev),
                          torch.zeros(m, p.shape[1], device=dev))
        rows = torch.arange(start, start + len(x), device=dev)
        banks.write(rows, h, p)
    assert banks is not None
    return banks


def adapt_with_banks(model: nn.Module, source, objective: Objective, recipe: Recipe,
                     seed: int = 0, device: torch.device | str | None = None,
                     progress: bool = False, name: str = "adapter") -> nn.Module:
    """Adapt ``model`` in place to the unlabeled ``source`` by minimising ``objective`` over
    ``recipe.epochs`` passes of ``recipe.batch_size`` (the schedule above). Deterministic given
    ``seed`` (batches, dropout). Returned in eval mode on the device it came on; FusionError on
    a non-finite loss. A target of fewer than 2 samples, or no step, leaves it unchanged."""
    dev = pick_device(device)
    head = classifier_head(model, name)
    home = next(model.parameters()).device
    model = model.to(dev)
    m = len(source)
    steps = recipe.num_steps(m)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params or steps == 0 or m < 2:
        return model.to(home).eval()
    features = _Features(head)
    try:
        banks = fill_banks(model, source, features, dev)
        _train(model, source, objective, recipe, banks, features, _Run(seed, dev, progress, name))
    finally:
        features.remove()
    return model.to(home).eval()


@dataclass(frozen=True)
class _Run:
    seed: int
    dev: torch.device
    progress: bool
    name: str


def _train(model: nn.Module, source, objective: Objective, recipe: Recipe, banks: Banks,
           features: _Features, run: _Run) -> None:
    m = len(source)
    gen = torch.Generator().manual_seed(run.seed)
    torch.manual_seed(run.seed)  # dropout masks
    batches = list(_batches(m, recipe.num_steps(m), recipe.batch_size, gen))
    rows = np.unique(np.concatenate(batches))
    data = gather_rows(source, rows)  # one streaming read instead of a random read per step
    params = [p for p in model.parameters() if p.requires_grad]
    opt = shot_sgd(params, recipe.lr)
    total = len(batches)
    model.train()
    for step, idx in enumerate(tqdm(batches, desc=run.name, leave=False,
                                    disable=not run.progress)):
        x = torch.from_numpy(data[np.searchsorted(rows, idx)]).to(run.dev)
        probs = F.softmax(model(x), 1)
        batch_rows = torch.from_numpy(idx).to(run.dev)
        with torch.no_grad():
            banks.write(batch_rows, features.take().float(), probs.float())
        loss = objective(probs, batch_rows, banks, step / total)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FusionError(f"{run.name} diverged: loss is {value} at step {step}")
        anneal(opt, recipe.lr, step, total)  # before each step, from step 1 of N
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
