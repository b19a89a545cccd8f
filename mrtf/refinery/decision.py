"""DECISION: several source models adapted together to one unlabeled target, with learned
source weights (Ahmed, Raychaudhuri, Paul, Oymak & Roy-Chowdhury, "Unsupervised Multi-source
Domain Adaptation Without Access to Source Data", CVPR 2021, arXiv 2104.01845; code
github.com/driptaRC/DECISION, ``adapt_multi.py``).

Each source model j is split as in SHOT (shot.py) into a feature extractor φ_j, adapted, and
a hypothesis ψ_j, its last ``nn.Linear``, frozen. The target model is the weighted combination
of the sources' outputs, θ_T(x) = Σ_j α_j θ_j(x) with α on the simplex (the paper's "weighted
information maximization"; the terms are cited by the paper's names, L_ent, L_div, L_pl): as
in the paper and the authors' code it combines the sources' *logits*, and the softmax δ is
taken after combining. Here α = softmax(a), a learned from 0 (uniform; the code normalises
raw scalars by their sum, which lets a weight go negative).
All φ_j and a are trained on

    L = L_ent + div_weight · L_div + β · L_pl

L_ent = -E_x Σ_k δ_k(θ_T(x)) log δ_k(θ_T(x)), L_div = Σ_k p̄_k log p̄_k with p̄ = E_x δ(θ_T(x))
(SHOT's information maximisation, on the combination; with the target's class shares π the
user gave, ``DecisionSettings.class_prior``, L_div = Σ_k p̄_k log(p̄_k / π_k) = KL(p̄ ‖ π),
prior_diversity.py), and L_pl = CE(θ_T(x), ŷ(x)) to the "weighted pseudo-labels" ŷ of
:func:`weighted_pseudo_labels`, refreshed once per epoch with the α of that moment (the code
re-weights its stored features with the current α at every step). The labels are the argmax
of δ(θ_T(x)) with the final α. The target's ``y`` is never read. docs/decision.md lists every
difference from the authors' code.

Cost (``DecisionSettings``): one optimiser step runs every source on the same batch (a shared
data pass); the pseudo-labels are refreshed once per epoch by one eval-mode pass per source.
The run is bounded by a per-source sample budget (40,000 samples: 4 epochs of a 10,000-image
target, at most 15 epochs, the authors' code default, on small targets), not by SHOT's 30
epochs: K = 10 LeNets on 10,000 MNIST images took 194 CPU seconds for the whole refine, one
thread (docs/benchmarks/decision.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from mrtf.device import pick_device
from mrtf.errors import FusionError, InputError
from mrtf.io.read_ahead import source_chunks
from mrtf.models import has_batchnorm
from mrtf.refinery.cluster import prototypes
from mrtf.refinery.distill import _batches, gather_rows
from mrtf.refinery.placement import home_device
from mrtf.refinery.prior_diversity import (
    PRIOR_RULE,
    check_prior_classes,
    mean_diversity,
    valid_prior,
)
from mrtf.refinery.shot import _last_linear, _with_one, shot_pseudo_labels
from mrtf.schedule import anneal, shot_sgd

_EPS = 1e-5  # inside log(p̄), as SHOT's and DECISION's code
_CHUNK = 1024  # rows per inference chunk of the eval passes


@dataclass(frozen=True)
class DecisionSettings:
    """DECISION's target stage (the paper's "implementation details", and its code).

    lr : SGD learning rate of every adapted parameter and of the source weights, annealed
        by SHOT's inverse decay (mrtf/schedule.py). The paper trains a pretrained backbone at
        1e-3 and the new layers at 1e-2; a digit LeNet has no pretrained backbone, and SHOT's
        digit code, which DECISION's digit network follows, trains all of it at 1e-2.
    beta : the weight λ of L_pl: the paper's 0.1 for digits (0.3 for objects). 0 drops the
        pseudo-labels (and their clustering passes).
    div_weight : the weight of L_div (1, as the paper).
    batch_size : 32, the paper's.
    sample_budget : samples each source trains on over the run; the epochs are
        ceil(sample_budget / M), at least 1 and at most ``max_epochs``. A cost choice
        (module docstring), not a tuned one.
    max_epochs : the authors' code default, 15.
    class_prior : the target's class shares π (summing to 1) when the user gave them
        (``refine --class-frequencies``): L_div aims the combination's mean prediction at
        them, KL(p̄ ‖ π), where DECISION's aims at an even spread; None (default):
        DECISION's. Not an ``--option``: refine sets it from the frequencies.
    """

    lr: float = 0.01
    beta: float = 0.1
    div_weight: float = 1.0
    batch_size: int = 32
    sample_budget: int = 40_000
    max_epochs: int = 15
    class_prior: tuple[float, ...] | None = field(default=None, metadata={"option": False})

    def epochs(self, m: int) -> int:
        """Passes over a target of ``m`` samples."""
        return max(1, min(self.max_epochs, math.ceil(self.sample_budget / max(m, 1))))

    def steps_per_epoch(self, m: int) -> int:
        return math.ceil(m / min(self.batch_size, max(m, 1)))

    def validate(self) -> None:
        checks = [
            (0 < self.lr < math.inf, f"lr must be a finite number > 0, got {self.lr}"),
            (0 <= self.beta < math.inf, f"beta must be finite and >= 0, got {self.beta}"),
            (0 <= self.div_weight < math.inf,
             f"div_weight must be finite and >= 0, got {self.div_weight}"),
            (self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}"),
            (self.sample_budget >= 0, f"sample_budget must be >= 0, got {self.sample_budget}"),
            (self.max_epochs >= 1, f"max_epochs must be >= 1, got {self.max_epochs}"),
            (valid_prior(self.class_prior), PRIOR_RULE),
        ]
        for ok, msg in checks:  # `not ok` also rejects NaN
            if not ok:
                raise InputError(f"DECISION: {msg}")


@dataclass
class DecisionResult:
    """models: the adapted source models (eval mode, the order given). alpha (K,): the learned
    source weights, summing to 1. probs (M, C) float32: δ(θ_T(x)), the weighted ensemble's
    softmax on the target (its argmax: the labels). epochs, steps: what ran."""

    models: list[nn.Module]
    alpha: np.ndarray
    probs: np.ndarray
    epochs: int
    steps: int


def combine(logits: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """θ_T(x) = Σ_j α_j θ_j(x): logits (K, B, C), alpha (K,) → (B, C)."""
    return torch.einsum("k,kbc->bc", alpha, logits)


def decision_loss(logits: torch.Tensor, alpha: torch.Tensor, labels: torch.Tensor | None,
                  settings: DecisionSettings) -> torch.Tensor:
    """L_ent + div_weight · L_div (+ β · L_pl when ``labels``) on θ_T = :func:`combine`
    (module docstring); logits (K, B, C) of the sources on one batch. L_div is -H(p̄), or
    KL(p̄ ‖ π) with ``settings.class_prior`` π (prior_diversity.py)."""
    z = combine(logits, alpha)
    p, logp = F.softmax(z, 1), F.log_softmax(z, 1)
    ent = -(p * logp).sum(1).mean()  # L_ent
    loss = ent + settings.div_weight * mean_diversity(p.mean(0), _EPS, settings.class_prior)
    if labels is not None:
        loss = loss + settings.beta * F.cross_entropy(z, labels)  # L_pl
    return loss


class _WeightedLabels:
    """The weighted pseudo-labels, accumulated one source at a time (one source's features
    in memory at once). Per source j, as the authors' code (``obtain_label``): SHOT's
    clustering on φ_j's features (shot.py: the softmax-weighted centroids and nearest
    centroid, SHOT Eq. 4-5), then the centroids c_j,k of the hard clusters, all on SHOT's basis
    (a 1 appended, L2-normalised). Combined: centroids Σ_j α_j c_j,k and features
    Σ_j α_j f_j(x), and ŷ(x) = the nearest combined centroid (Euclidean, as the code). Sources
    whose feature widths differ cannot be summed: then ŷ(x) = argmin_k Σ_j α_j ‖f_j(x) −
    c_j,k‖², the distance on the √α_j-scaled concatenation (this module's extension). A class
    no source clusters anything into is never a label."""

    def __init__(self, m: int, c: int, same_width: bool) -> None:
        self.m, self.c, self.same_width = m, c, same_width
        self.features: np.ndarray | None = None  # Σ α_j f_j, (M, D + 1)
        self.centroids: np.ndarray | None = None  # Σ α_j c_j, (C, D + 1)
        self.distances = np.zeros((m, c), np.float64)  # Σ α_j ‖f_j − c_j,k‖²
        self.mass = np.zeros(c, np.float64)

    def add(self, weight: float, probs: np.ndarray, features: np.ndarray) -> None:
        """Source j's softmax (M, C) and features (M, D_j), with its weight α_j."""
        first = shot_pseudo_labels(probs, features, iterations=1)
        onehot = np.eye(self.c, dtype=np.float32)[first]
        centroids, mass = prototypes(onehot, features, basis=_with_one)
        self.mass += mass
        f = _with_one(features).astype(np.float64)
        if self.same_width:
            self.features = weight * f if self.features is None else self.features + weight * f
            self.centroids = weight * centroids if self.centroids is None else \
                self.centroids + weight * centroids
        else:
            self.distances += weight * _sq_distances(f, centroids)

    def labels(self) -> np.ndarray:
        """ŷ (M,) int64 over the sources added."""
        if self.same_width:
            assert self.features is not None and self.centroids is not None
            d = _sq_distances(self.features, self.centroids)
        else:
            d = self.distances
        return np.where(self.mass[None] > 0, d, np.inf).argmin(1).astype(np.int64)


def _sq_distances(f: np.ndarray, c: np.ndarray) -> np.ndarray:
    """‖f_i − c_k‖² (M, K) for rows f (M, D) and c (K, D)."""
    return np.maximum((f * f).sum(1)[:, None] - 2.0 * f @ c.T + (c * c).sum(1)[None], 0.0)


def weighted_pseudo_labels(probs: Sequence[np.ndarray], features: Sequence[np.ndarray],
                           alpha: np.ndarray) -> np.ndarray:
    """The weighted pseudo-labels ŷ (M,) of K sources' softmax (M, C) and features (M, D_j)
    with weights ``alpha`` (K,) (:class:`_WeightedLabels`)."""
    if not len(probs) or len(probs) != len(features) or len(probs) != len(alpha):
        raise InputError(f"need as many probs, features and weights (> 0), got {len(probs)}, "
                         f"{len(features)} and {len(alpha)}")
    m, c = probs[0].shape
    acc = _WeightedLabels(m, c, len({f.shape[1] for f in features}) == 1)
    for w, p, f in zip(alpha, probs, features):
        acc.add(float(w), p, f)
    return acc.labels()


@torch.inference_mode()
def _eval_pass(models: Sequence[nn.Module], alpha: np.ndarray, source, dev: torch.device,
               with_labels: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """One eval-mode pass of every source over ``source``: the combined logits Σ_j α_j θ_j(x)
    (M, C) and, ``with_labels``, the weighted pseudo-labels. Features are the input of each
    head, taken with a forward hook (as shot.py)."""
    heads = [_last_linear(mod) for mod in models]
    m = len(source)
    acc = None
    if with_labels:
        acc = _WeightedLabels(m, heads[0].out_features,
                              len({h.in_features for h in heads}) == 1)
    combined: np.ndarray | None = None
    got: list[torch.Tensor] = []  # the hooked features of the chunk just run
    for w, mod, head in zip(alpha, models, heads):
        mod.eval()
        hook = head.register_forward_pre_hook(lambda _m, inp: got.append(inp[0].flatten(1)))
        try:
            logits = np.empty((m, head.out_features), np.float32)
            feats = np.empty((m, head.in_features), np.float32) if with_labels else None
            for start, x in source_chunks(source, _CHUNK, dev):  # CUDA: read ahead
                z = mod(torch.from_numpy(np.ascontiguousarray(x)).to(dev)).float().cpu()
                logits[start:start + len(z)] = z.numpy()
                h = got.pop()
                if feats is not None:
                    feats[start:start + len(h)] = h.float().cpu().numpy()
        finally:
            hook.remove()
        if not np.isfinite(logits).all() or (feats is not None and not np.isfinite(feats).all()):
            raise FusionError("DECISION: a source's predictions or features are not finite")
        combined = w * logits if combined is None else combined + w * logits
        if acc is not None and feats is not None:
            acc.add(float(w), _softmax(logits), feats)
    assert combined is not None
    return combined.astype(np.float32), None if acc is None else acc.labels()


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def decision_adapt(models: Sequence[nn.Module], source, settings: DecisionSettings | None = None,
                   seed: int = 0, device: torch.device | str | None = None,
                   progress: bool = False) -> DecisionResult:
    """Adapt ``models`` (changed in place: give copies) together to the unlabeled ``source``
    (H5Dataset / ArraySource) with DECISION (module docstring). Every model needs a last
    ``nn.Linear`` (its head, frozen; its ``requires_grad`` restored) and all must predict the
    same classes, one share of ``settings.class_prior`` each when given (else InputError).
    Deterministic given ``seed``; FusionError on a non-finite loss."""
    cfg = settings or DecisionSettings()
    cfg.validate()
    if not models:
        raise InputError("DECISION needs at least one source model")
    dev = pick_device(device)
    # adapted in place on the device, and returned where the caller had them (placement.py)
    homes = [home_device(mod) for mod in models]
    models = [mod.to(dev) for mod in models]
    heads = [_last_linear(mod) for mod in models]
    if len({h.out_features for h in heads}) != 1:
        raise InputError("DECISION: the source models predict different numbers of classes")
    check_prior_classes("DECISION", cfg.class_prior, heads[0].out_features)
    saved = [(p, p.requires_grad) for h in heads for p in h.parameters()]
    for p, _ in saved:
        p.requires_grad_(False)  # the source hypotheses ψ_j are kept (as SHOT)
    a = torch.zeros(len(models), device=dev, requires_grad=True)  # α = softmax(a), uniform
    try:
        epochs, steps = _train(models, a, source, cfg, seed, progress)
    finally:
        for p, flag in saved:
            p.requires_grad_(flag)
    alpha = torch.softmax(a.detach(), 0).cpu().numpy().astype(np.float64)
    combined, _ = _eval_pass(models, alpha, source, dev, with_labels=False)
    models = [mod.eval() if home is None else mod.to(home).eval()
              for mod, home in zip(models, homes)]
    return DecisionResult(models, alpha, _softmax(combined), epochs, steps)


def _train(models: list[nn.Module], a: torch.Tensor, source, cfg: DecisionSettings, seed: int,
           progress: bool) -> tuple[int, int]:
    """The optimisation; returns (epochs, steps) run (0, 0 when nothing can train)."""
    m, dev = len(source), a.device
    params = [p for mod in models for p in mod.parameters() if p.requires_grad]
    batch = min(cfg.batch_size, m)
    if not params or (batch < 2 and any(has_batchnorm(mod) for mod in models)):
        return 0, 0  # nothing to adapt, or BatchNorm cannot train on single-sample batches
    epochs, every = cfg.epochs(m), cfg.steps_per_epoch(m)
    opt = shot_sgd([{"params": params}, {"params": [a]}], cfg.lr)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout masks
    batches = list(_batches(m, epochs * every, cfg.batch_size, gen))
    rows = np.unique(np.concatenate(batches))
    data = gather_rows(source, rows)  # one streaming read, then every step is in memory
    labels = None
    for mod in models:
        mod.train()  # BatchNorm on batch statistics, dropout on, as SHOT's and DECISION's code
    for step, idx in enumerate(tqdm(batches, desc="decision", leave=False,
                                    disable=not progress)):
        if cfg.beta > 0 and step % every == 0:  # refreshed once per epoch, in eval mode
            alpha = torch.softmax(a.detach(), 0).cpu().numpy().astype(np.float64)
            _, got = _eval_pass(models, alpha, source, dev, with_labels=True)
            labels = torch.from_numpy(got)
            for mod in models:
                mod.train()
        x = torch.from_numpy(data[np.searchsorted(rows, idx)]).to(dev)
        logits = torch.stack([mod(x) for mod in models])
        y = None if labels is None else labels[idx].to(dev)
        loss = decision_loss(logits, torch.softmax(a, 0), y, cfg)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FusionError(f"DECISION diverged: loss is {value} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        anneal(opt, cfg.lr, step, len(batches))  # before each step, from step 1 of N
        opt.step()
    return epochs, len(batches)
