"""SHOT's learning-rate annealing (Liang et al. 2020, code ``lr_scheduler``; from Ganin &
Lempitsky's DANN, 2015): lr_i = lr_0 · (1 + γ·i/N)^(−p), γ = 10, p = 0.75, for step i = 1..N.
Used by a party's local training (``LocalConfig.lr_decay``) and by SHOT's target stage
(``ShotSettings.paper()``), so both decay the same way; AaD, NRC and DECISION (whose authors'
code is built on SHOT's) adapt with the same SGD (:func:`shot_sgd`, :func:`anneal`). The
project's Adam (:func:`adam`) is the distillation's and its own SHOT settings'."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

GAMMA = 10.0
POWER = 0.75
#: SHOT's code (digit/uda_digit.py): SGD momentum 0.9, Nesterov, weight decay 1e-3
SGD_MOMENTUM, SGD_WEIGHT_DECAY = 0.9, 1e-3
#: the optimisers step one tensor at a time, on CUDA as on the CPU: the multi-tensor
#: (foreach) kernels' CUDA modules cost host memory that a LeNet's few tensors do not repay
#: (docs/gpu.md, "Host memory")
FOREACH = False


def inverse_decay(step: int, total: int, gamma: float = GAMMA, power: float = POWER) -> float:
    """The factor on lr_0 for 0-based ``step`` of ``total``: SHOT calls its scheduler with the
    1-based iteration before each step, so step 0 already has (1 + γ/N)^(−p) and the last
    step (1 + γ)^(−p) (0.166 at the defaults)."""
    if total < 1 or step < 0:
        raise ValueError(f"need total >= 1 and step >= 0, got step {step} of {total}")
    return (1.0 + gamma * min(step + 1, total) / total) ** (-power)


def shot_sgd(params: Iterable[Any], lr: float) -> torch.optim.SGD:
    """SHOT's optimiser over ``params`` (tensors or parameter groups): SGD at ``lr`` with
    momentum 0.9, Nesterov and weight decay 1e-3; its lr is then set step by step
    (:func:`anneal`)."""
    return torch.optim.SGD(params, lr=lr, momentum=SGD_MOMENTUM, nesterov=True,
                           weight_decay=SGD_WEIGHT_DECAY, foreach=FOREACH)


def adam(params: Iterable[Any], lr: float, weight_decay: float = 0.0) -> torch.optim.Adam:
    """Adam over ``params`` at ``lr`` (and ``weight_decay``), one tensor at a time
    (:data:`FOREACH`)."""
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, foreach=FOREACH)


def anneal(opt: torch.optim.Optimizer, lr: float, step: int, total: int) -> None:
    """Every group's lr to lr · :func:`inverse_decay` (step, total), set before the step
    (SHOT sets it before each step, from step 1 of N)."""
    for group in opt.param_groups:
        group["lr"] = lr * inverse_decay(step, total)


def epoch_steps(epochs: int, batch_size: int, m: int) -> int:
    """Optimiser steps of ``epochs`` passes over ``m`` samples, ceil(m / batch) each (SHOT's
    and its successors' ``max_iter = max_epoch · len(loader)``)."""
    return epochs * math.ceil(m / min(batch_size, max(m, 1)))
