"""SHOT baseline: source hypothesis transfer without source data (Liang, Hu & Feng, ICML 2020).

The received model is split into a feature extractor g and a hypothesis h, the last
``nn.Linear``. h is frozen and g is trained on the unlabeled target with information
maximisation (Eq. 2-3: confident per-sample predictions, diverse on average) plus β times
the cross-entropy to self-supervised pseudo-labels (Eq. 4-6: weighted k-means on g's features,
cosine distance). A baseline for the MrTF refinery; the target's ``y`` is never read.

Two named recipes (:func:`shot_settings`): ``mrtf``, ``ShotSettings()``, the project's (Adam
3e-5, 500 steps; the adaptive default's SHOT branch), and ``paper``, ``ShotSettings.paper()``,
SHOT's own digit recipe (SGD 0.01 with its decay, 30 epochs, β 0.1). With a party trained by
SHOT's source recipe (``mrtf simulate --recipe shot``) the paper recipe reproduces SHOT at
K = 1 (docs/benchmarks/standard-digits.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mrtf.device import pick_device
from mrtf.errors import FusionError, InputError
from mrtf.models import has_batchnorm
from mrtf.refinery.cluster import prototypes
from mrtf.refinery.distill import _batches, gather_rows
from mrtf.refinery.prior_diversity import (
    PRIOR_RULE,
    check_prior_classes,
    mean_diversity,
    valid_prior,
)
from mrtf.schedule import adam, anneal, epoch_steps, shot_sgd

_EPS = 1e-5  # inside log(mean prediction), as SHOT's code: finite when a class mean is 0
_CHUNK = 1024  # rows per inference chunk of the pseudo-label pass
_LABEL_BLOCK = 65_536  # rows per block of the nearest-centroid pass
OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class ShotSettings:
    """SHOT's settings (SHOT Sect. 3-4; defaults: β 0.3, diversity weight 1, 2 clustering steps).

    lr : Adam, the project's distillation optimiser (one optimiser and step budget for every
        baseline), not SHOT's SGD 1e-2 + momentum + decay schedule, which was set for an
        ImageNet-pretrained ResNet. 3e-5 is from a sweep on two simulated digits federations
        (LeNet, 500 target samples, 500 steps; y only to score): Adam at 1e-3 / 3e-4 made one
        of them worse than no adaptation (the entropy term over-sharpens wrong predictions
        before the pseudo-labels can correct them), 1e-5 adapted too little.
    refresh_every : 0 = once per pass over the target, ceil(M / batch_size) steps (SHOT:
        once per epoch).
    cluster_iters : 1 = Eq. 4-5, 2 = then Eq. 6 once (SHOT's code), 0 = the model's argmax.
    beta : 0 gives SHOT-IM (no pseudo-labels, and no clustering pass).
    optimizer : 'adam' (the project's, above) or 'sgd': SHOT's code, SGD momentum 0.9,
        Nesterov, weight decay 1e-3, lr·(1 + 10·i/N)^−0.75 over the N steps (mrtf/schedule.py).
    epochs : > 0 sets the steps to ``epochs`` passes over the target, ceil(M / batch_size)
        steps each (SHOT: 30), instead of ``steps``.
    max_steps : > 0 caps the steps ``epochs`` gives (a large target: SHOT's 30 passes over a
        million rows would be 470,000 steps); 0 = no cap (SHOT's recipe as published).
    class_prior : the target's class shares (summing to 1) when the user gave them
        (``refine --class-frequencies``): the diversity term pulls the mean prediction to
        them, KL(p̄ ‖ π), where SHOT's Eq. 3 pulls it to an even spread; None (default):
        SHOT's. Not an ``--option``: refine sets it from the frequencies.

    ``ShotSettings()`` is the project's tuned baseline (the adaptive default's SHOT branch);
    :meth:`paper` is SHOT's own digit recipe.
    """

    steps: int = 500
    batch_size: int = 64
    lr: float = 3e-5
    beta: float = 0.3
    div_weight: float = 1.0
    refresh_every: int = 0
    cluster_iters: int = 2
    optimizer: str = "adam"
    epochs: int = 0
    max_steps: int = 0
    class_prior: tuple[float, ...] | None = field(default=None, metadata={"option": False})

    @classmethod
    def paper(cls, epochs: int = 30) -> ShotSettings:
        """SHOT's digit recipe (code ``digit/uda_digit.py`` + ``digit.sh``): SGD lr 0.01 with
        the schedule above, ``epochs`` passes of batch 64 (30), β = cls_par 0.1, diversity
        weight 1, one soft and one hard clustering step, labels refreshed every epoch. The
        head frozen and the rest trained in train mode (BatchNorm on batch statistics, dropout
        on), as SHOT's code does, is what :func:`shot_adapt` does for every recipe."""
        return cls(batch_size=64, lr=0.01, beta=0.1, div_weight=1.0, refresh_every=0,
                   cluster_iters=2, optimizer="sgd", epochs=epochs)

    def num_steps(self, m: int) -> int:
        """Optimiser steps on a target of ``m`` samples."""
        if self.epochs > 0:
            steps = epoch_steps(self.epochs, self.batch_size, m)
            return min(steps, self.max_steps) if self.max_steps > 0 else steps
        return self.steps

    def refresh_interval(self, m: int) -> int:
        """Optimiser steps between pseudo-label refreshes on ``m`` samples: ``refresh_every``,
        or one pass over the target (SHOT: once per epoch)."""
        return self.refresh_every or math.ceil(m / min(self.batch_size, m))

    def validate(self) -> None:
        checks = [
            (self.steps >= 0, f"steps must be >= 0, got {self.steps}"),
            (self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}"),
            (0 < self.lr < math.inf, f"lr must be a finite number > 0, got {self.lr}"),
            (0 <= self.beta < math.inf, f"beta must be finite and >= 0, got {self.beta}"),
            (0 <= self.div_weight < math.inf,
             f"div_weight must be finite and >= 0, got {self.div_weight}"),
            (self.refresh_every >= 0,
             f"refresh_every must be >= 0 (0 = once per pass), got {self.refresh_every}"),
            (self.cluster_iters >= 0, f"cluster_iters must be >= 0, got {self.cluster_iters}"),
            (self.optimizer in OPTIMIZERS,
             f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}"),
            (self.epochs >= 0, f"epochs must be >= 0 (0 = use steps), got {self.epochs}"),
            (self.max_steps >= 0, f"max_steps must be >= 0 (0 = no cap), got {self.max_steps}"),
            (valid_prior(self.class_prior), PRIOR_RULE),
        ]
        for ok, msg in checks:  # `not ok` (not a negated comparison) also rejects NaN
            if not ok:
                raise InputError(f"SHOT: {msg}")


SHOT_RECIPES = ("mrtf", "paper")


def shot_settings(recipe: str = "mrtf") -> ShotSettings:
    """The named recipe's settings: 'mrtf' (the project's) or 'paper' (SHOT's code)."""
    if recipe not in SHOT_RECIPES:
        raise InputError(f"unknown SHOT recipe {recipe!r}; choose from {', '.join(SHOT_RECIPES)}")
    return ShotSettings.paper() if recipe == "paper" else ShotSettings()


def shot_pseudo_labels(probs: np.ndarray, features: np.ndarray, iterations: int = 2
                       ) -> np.ndarray:
    """SHOT's self-supervised pseudo-labels, (M,) int64; probs (M, C), features (M, D).

    Iteration 1: centroids c_k = Σ δ_k(x) f(x) / Σ δ_k(x) weighted by the softmax δ (Eq. 4),
    label = nearest centroid under cosine distance (Eq. 5). Every further iteration: centroids
    from the hard labels, labels reassigned (Eq. 6). ``iterations`` 0 → argmax of ``probs``.
    As in SHOT's code, features get a constant 1 appended before L2 normalisation (an all-zero
    ReLU feature stays defined), and only classes that are the argmax of some sample can be
    labels (a class nobody predicts would get a centroid from residual probability mass).
    Pure numpy, deterministic; the inputs are not modified. ``features`` may be any array
    read by row slices (the streaming refinery's spill.SpillArray): it is read in blocks, so
    the (M, D + 1) normalised copy is never made, and the labels are the same either way.
    """
    if probs.ndim != 2 or len(features.shape) != 2 or len(probs) != len(features) or \
            not len(probs):
        raise InputError(f"need probs (M, C) and features (M, D) with the same M > 0, got "
                         f"{probs.shape} and {tuple(features.shape)}")
    labels = probs.argmax(1).astype(np.int64)
    if iterations == 0:
        return labels
    allowed = np.bincount(labels, minlength=probs.shape[1]) > 0
    weights = probs.astype(np.float32)
    for _ in range(iterations):
        # Eq. 4 (soft δ), then Eq. 6 (one-hot); float64 sums over row blocks
        centroids, _ = prototypes(weights, features, basis=_with_one)
        norm = np.linalg.norm(centroids, axis=1, keepdims=True)
        ok = allowed & (norm[:, 0] > 0)  # an emptied cluster (zero centroid) attracts nobody
        c = (centroids / np.maximum(norm, 1e-12)).astype(np.float32).T
        for s in range(0, len(labels), _LABEL_BLOCK):
            # argmin cosine distance = argmax cosine similarity (Eq. 5), row by row
            sim = _with_one(features[s:s + _LABEL_BLOCK]) @ c
            labels[s:s + len(sim)] = np.where(ok[None], sim, -np.inf).argmax(1)
        weights = np.eye(probs.shape[1], dtype=np.float32)[labels]
    return labels


def _with_one(h: np.ndarray) -> np.ndarray:
    """SHOT's feature basis, row-wise: a constant 1 appended, then L2 normalised."""
    f = np.concatenate([np.asarray(h, np.float32), np.ones((len(h), 1), np.float32)], 1)
    f /= np.linalg.norm(f, axis=1, keepdims=True)
    return f


def _last_linear(model: nn.Module) -> nn.Linear:
    """SHOT's hypothesis h: the last ``nn.Linear`` registered (the project's rule for user
    models, mrtf.models.custom: features are its input)."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise InputError("SHOT needs a model whose classifier is an nn.Linear (none found)")
    return linears[-1]


@torch.inference_mode()
def _refresh(model: nn.Module, head: nn.Linear, source, iterations: int,
             dev: torch.device, spill: bool = False, scratch_dir: str | None = None
             ) -> torch.Tensor:
    """Pseudo-labels over the whole ``source``, streamed, in eval mode (SHOT labels with the
    network in eval mode): features are the input of ``head``, taken with a forward hook.
    The (M, C) predictions are held; the (M, D) features too, or, with ``spill`` (the
    streaming refinery), written to a scratch file in ``scratch_dir`` (default: the system's
    temporary folder) and read back by blocks."""
    from contextlib import nullcontext

    from mrtf.refinery.spill import Scratch

    model.eval()
    m = len(source)
    probs: np.ndarray | None = None
    feats = None
    got: list[torch.Tensor] = []
    hook = head.register_forward_pre_hook(lambda _m, inp: got.append(inp[0].flatten(1)))
    try:
        with Scratch(scratch_dir) if spill else nullcontext() as scratch:
            for start, x in source.chunks(_CHUNK):
                p = F.softmax(model(torch.from_numpy(np.ascontiguousarray(x)).to(dev)), 1)
                p, h = p.float().cpu().numpy(), got.pop().float().cpu().numpy()
                if not (np.isfinite(p).all() and np.isfinite(h).all()):
                    raise FusionError("SHOT: the model's predictions or features are not "
                                      "finite")
                if probs is None:
                    probs = np.empty((m, p.shape[1]), np.float32)
                    feats = scratch.array("shot-features", (m, h.shape[1])) \
                        if scratch is not None else np.empty((m, h.shape[1]), np.float32)
                probs[start:start + len(p)] = p
                if scratch is not None:
                    feats.write(start, h)
                else:
                    feats[start:start + len(h)] = h
            assert probs is not None
            labels = shot_pseudo_labels(probs, feats, iterations)
    finally:
        hook.remove()
    model.train()
    return torch.from_numpy(labels)


def _loss(logits: torch.Tensor, labels: torch.Tensor | None, cfg: ShotSettings
          ) -> torch.Tensor:
    """L_ent - div_weight·H(p̄) (SHOT Eq. 2-3; Eq. 3's KL(p̄ ‖ uniform) is -H(p̄) + log C,
    same gradient) + beta·CE(pseudo-labels); with ``cfg.class_prior`` π the diversity term
    is KL(p̄ ‖ π) = -H(p̄) - Σ p̄ log π: Eq. 3 with the target's own class shares in place of
    the even spread it assumes (prior_diversity.py)."""
    p, logp = F.softmax(logits, 1), F.log_softmax(logits, 1)
    ent = -(p * logp).sum(1).mean()
    loss = ent + cfg.div_weight * mean_diversity(p.mean(0), _EPS, cfg.class_prior)
    if labels is not None:
        loss = loss + cfg.beta * F.cross_entropy(logits, labels)
    return loss


def shot_adapt(model: nn.Module, source, settings: ShotSettings | None = None, seed: int = 0,
               device: torch.device | str | None = None, progress: bool = False,
               spill: bool = False, scratch_dir: str | None = None) -> nn.Module:
    """Adapt ``model`` in place (no copy) to the unlabeled ``source`` (H5Dataset/ArraySource).

    The last ``nn.Linear`` (hypothesis) is frozen; the rest is trained in train mode
    (BatchNorm on batch statistics, dropout on, as SHOT's code) with ``settings.optimizer``
    (Adam, or SHOT's SGD schedule: :meth:`ShotSettings.paper`) on
    L_ent - div_weight·H(p̄) + beta·CE (SHOT Eq. 2-3 and Sect. 3.3), pseudo-labels from
    :func:`shot_pseudo_labels` on the head's input features, refreshed every
    ``refresh_every`` steps over the whole source. The head's ``requires_grad`` is restored.
    Deterministic given ``seed``. Returned in eval mode on the device it came on; FusionError on
    a non-finite loss. ``spill``: the pseudo-label pass keeps the target's features in a
    scratch file in ``scratch_dir``, not in memory (the streaming refinery; the same labels).
    """
    cfg = settings or ShotSettings()
    cfg.validate()
    dev = pick_device(device)
    head = _last_linear(model)
    check_prior_classes("SHOT", cfg.class_prior, head.out_features)
    home = next(model.parameters()).device  # the caller's model goes back where it was
    model = model.to(dev)
    saved = [(p, p.requires_grad) for p in head.parameters()]
    for p, _ in saved:
        p.requires_grad_(False)  # the source hypothesis is kept (SHOT Sect. 3.2)
    try:
        _train(model, head, source, _AdaptRun(cfg, seed, dev, progress, spill, scratch_dir))
    finally:
        for p, flag in saved:
            p.requires_grad_(flag)
    return model.to(home).eval()


@dataclass(frozen=True)
class _AdaptRun:
    """How one :func:`shot_adapt` call trains: its settings, seed and device, whether it
    shows progress, and whether the pseudo-label pass spills the features (to
    ``scratch_dir``)."""

    cfg: ShotSettings
    seed: int
    dev: torch.device
    progress: bool
    spill: bool = False
    scratch_dir: str | None = None


def _train(model: nn.Module, head: nn.Linear, source, run: _AdaptRun) -> None:
    cfg, seed, dev = run.cfg, run.seed, run.dev
    params = [p for p in model.parameters() if p.requires_grad]
    m = len(source)
    steps = cfg.num_steps(m)
    if not params or steps == 0 or (min(cfg.batch_size, m) < 2 and has_batchnorm(model)):
        return  # nothing to train, or BatchNorm cannot train on single-sample batches
    opt = _optimizer(params, cfg)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout masks
    batches = list(_batches(m, steps, cfg.batch_size, gen))
    rows = np.unique(np.concatenate(batches))
    data = gather_rows(source, rows)  # one streaming read instead of a random read per step
    every = cfg.refresh_interval(m)
    labels = None
    from tqdm import tqdm

    model.train()
    for step, idx in enumerate(tqdm(batches, desc="shot", leave=False,
                                    disable=not run.progress)):
        if cfg.beta > 0 and step % every == 0:
            labels = _refresh(model, head, source, cfg.cluster_iters, dev, run.spill,
                              run.scratch_dir)
        x = torch.from_numpy(data[np.searchsorted(rows, idx)]).to(dev)
        loss = _loss(model(x), None if labels is None else labels[idx].to(dev), cfg)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FusionError(f"SHOT diverged: loss is {value} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.optimizer == "sgd":  # SHOT's schedule (mrtf/schedule.py)
            anneal(opt, cfg.lr, step, len(batches))
        opt.step()


def _optimizer(params: list[torch.Tensor], cfg: ShotSettings) -> torch.optim.Optimizer:
    """Adam at ``cfg.lr`` (the project's), or SHOT's SGD (its lr set step by step)."""
    if cfg.optimizer == "sgd":
        return shot_sgd(params, cfg.lr)
    return adam(params, cfg.lr)
