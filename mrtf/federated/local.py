"""The client update: SGD with momentum on a party's own data (FedAvg, FedProx)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mrtf.models import has_batchnorm
from mrtf.refinery.augment import Jitter, applies, jitter
from mrtf.schedule import inverse_decay

LR_DECAYS = ("none", "inverse")
#: SHOT's USPS source augmentation: RandomCrop(28, padding=4) and RandomRotation(10)
SHOT_JITTER = Jitter(shift=4 / 28, rotate=10.0)
#: The local batch of a party's update, the one default of LocalConfig, the simulator
#: (RunConfig: ``mrtf simulate``, ``mrtf demo``) and the Flower run config. 16, not the
#: reference code's 64: simulated clients hold ~200 samples, and 64 left a 10-round federation
#: near chance (docs/benchmarks/demo-and-runs.md, "Defaults").
LOCAL_BATCH_SIZE = 16


@dataclass
class LocalConfig:
    """Client-update settings (SGD lr 0.05, momentum 0.9, wd 1e-5, batch
    :data:`LOCAL_BATCH_SIZE`, grad-clip 100; the reference code's batch is 64). ``steps``
    overrides ``epochs`` when set; ``mu`` > 0 adds FedProx's proximal term
    μ/2·‖θ − θ_global‖².

    The party recipe's knobs (docs/party-recipe.md; all off by default, as before):
    label_smoothing : ε of the cross-entropy's smoothed targets (1 − ε)·onehot + ε/C (SHOT's
        source training: 0.1; it keeps the source features from over-fitting the source's
        labels, which helps the hypothesis transfer, SHOT Sect. 3.1).
    nesterov : Nesterov momentum (SHOT: on).
    lr_decay : 'none' or 'inverse', lr·(1 + 10·i/N)^−0.75 over the N local steps (SHOT's
        schedule, mrtf/schedule.py).
    augment : a random shift + rotation of every training image (augment.py), or None.
    """

    epochs: int = 2
    steps: int | None = None
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 1e-5
    batch_size: int = LOCAL_BATCH_SIZE
    clip: float = 100.0
    mu: float = 0.0
    label_smoothing: float = 0.0
    nesterov: bool = False
    lr_decay: str = "none"
    augment: Jitter | None = None

    def __post_init__(self) -> None:
        if self.epochs < 1 and not self.steps:
            raise ValueError("epochs must be >= 1 (or steps given)")
        if self.lr <= 0 or self.batch_size < 1 or self.mu < 0:
            raise ValueError("lr and batch_size must be positive and mu >= 0")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.lr_decay not in LR_DECAYS:
            raise ValueError(f"lr_decay must be one of {', '.join(LR_DECAYS)}, "
                             f"got {self.lr_decay!r}")
        if self.nesterov and self.momentum <= 0:
            raise ValueError("nesterov needs momentum > 0")


@dataclass
class LocalResult:
    """A trained client model with what it reports to the server."""

    model: nn.Module
    train_loss: float  # mean cross-entropy over the local steps
    label_counts: list[int]
    n_samples: int


def local_train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                config: LocalConfig, seed: int, device: torch.device | str = "cpu",
                control: dict[str, torch.Tensor] | None = None) -> LocalResult:
    """Train a copy of ``model`` on (x (n, ...), y (n,)); ``model`` itself is not changed.

    ``control`` (SCAFFOLD's c − c_k, per parameter name) is added to every gradient if given.
    """
    local = copy.deepcopy(model).to(device).train()
    start = [p.detach().clone() for p in local.parameters()] if config.mu > 0 else None
    opt = torch.optim.SGD(local.parameters(), lr=config.lr, momentum=config.momentum,
                          weight_decay=config.weight_decay, nesterov=config.nesterov)
    gen = torch.Generator().manual_seed(seed)
    n = len(x)
    batch = min(config.batch_size, n)
    steps = config.steps or config.epochs * max(1, int(np.ceil(n / batch)))
    augment = config.augment if config.augment is not None and \
        applies(tuple(x.shape[1:])) else None
    # its own stream, so the batches are those of the same run without augmentation
    moves = torch.Generator().manual_seed(seed + 7919)
    losses: list[float] = []
    order = torch.randperm(n, generator=gen)
    cursor = 0
    named = dict(local.named_parameters())
    for step in range(steps):
        if config.lr_decay == "inverse":
            for group in opt.param_groups:
                group["lr"] = config.lr * inverse_decay(step, steps)
        if cursor + batch > n:
            order, cursor = torch.randperm(n, generator=gen), 0
        idx = order[cursor:cursor + batch]
        cursor += batch
        xb, yb = x[idx].to(device), y[idx].to(device)
        if len(idx) == 1 and has_batchnorm(local):
            continue  # BatchNorm cannot train on a single sample
        if augment is not None:
            xb = jitter(xb, moves, augment)
        loss = F.cross_entropy(local(xb), yb, label_smoothing=config.label_smoothing)
        total = loss
        if start is not None:
            prox = sum(((p - p0) ** 2).sum() for p, p0 in zip(local.parameters(), start))
            total = loss + 0.5 * config.mu * prox
        opt.zero_grad(set_to_none=True)
        total.backward()
        if control is not None:
            for name, c in control.items():
                if named[name].grad is not None:
                    named[name].grad.add_(c.to(device))
        if config.clip > 0:
            nn.utils.clip_grad_norm_(local.parameters(), config.clip)
        opt.step()
        losses.append(float(loss.detach()))
    counts = torch.bincount(y.cpu().long(), minlength=num_classes).tolist()
    return LocalResult(model=local.eval(), train_loss=float(np.mean(losses)) if losses else
                       float("nan"), label_counts=counts, n_samples=n)


@torch.inference_mode()
def correct_mask(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024,
                 device: torch.device | str = "cpu") -> np.ndarray:
    """(N,) bool: whether ``model`` (put in eval mode) predicts each ``y``; batched, no graph."""
    model = model.to(device).eval()
    out = np.empty(len(x), dtype=bool)
    for start in range(0, len(x), batch_size):
        pred = model(x[start:start + batch_size].to(device)).argmax(1).cpu()
        out[start:start + batch_size] = (pred == y[start:start + batch_size]).numpy()
    return out


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024,
             device: torch.device | str = "cpu") -> float:
    """Per-sample accuracy (not a mean of per-batch accuracies)."""
    return float(correct_mask(model, x, y, batch_size, device).sum()) / max(1, len(x))
