"""The diversity term of the information-maximisation adapters, aimed at the target's class
shares when the user gave them (``refine --class-frequencies``, RefineConfig.class_shares).

SHOT (Eq. 3, shot.py), NRC (its L_div, nrc.py) and DECISION (its L_div, decision.py) keep a
batch's mean prediction p̄ from collapsing onto a few classes with Σ_c p̄_c log p̄_c, which is
KL(p̄ ‖ uniform) less its constant log C: its minimum is the even spread, so on a target whose
classes are skewed it pulls the labels toward an even spread that is not there. With the
target's shares π the term is KL(p̄ ‖ π) = Σ_c p̄_c log(p̄_c / π_c), whose minimum, 0, is at
p̄ = π. Without π each adapter's term is its original expression, bit for bit.

Each adapter's settings carry π as ``class_prior`` (not an ``--option``: the methods set it
from the frequencies, :func:`with_class_shares`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

import torch

from mrtf.errors import InputError

#: what a settings' ``class_prior`` must be, as its ``validate()`` says it
PRIOR_RULE = "class_prior must be at least 2 positive shares summing to 1"

_Settings = TypeVar("_Settings")


def valid_prior(prior: Sequence[float] | None) -> bool:
    """None, or at least 2 finite positive shares summing to 1 (within 1e-6)."""
    if prior is None:
        return True
    return (len(prior) >= 2 and all(math.isfinite(v) and v > 0 for v in prior)
            and abs(sum(prior) - 1.0) < 1e-6)


def check_prior_classes(name: str, prior: Sequence[float] | None, num_classes: int) -> None:
    """One-line InputError when ``prior`` is given and does not hold one share per class of
    the model (``name``: the adapter, which starts the line)."""
    if prior is not None and len(prior) != num_classes:
        raise InputError(f"{name}: {len(prior)} class shares for a model with {num_classes} "
                         "classes")


def mean_diversity(mean: torch.Tensor, eps: float, prior: Sequence[float] | None = None
                   ) -> torch.Tensor:
    """Σ_c p̄_c log(p̄_c + ε) for the mean prediction ``mean`` (C,), less Σ_c p̄_c log π_c
    with ``prior`` π: KL(p̄ ‖ π), 0 at p̄ = π (up to ε), where the first is KL(p̄ ‖ uniform)
    less log C. ε keeps the log finite when a class's mean is 0 (SHOT's and NRC's code)."""
    log_ratio = torch.log(mean + eps)
    if prior is not None:
        log_ratio = log_ratio - torch.log(torch.tensor(prior, dtype=mean.dtype,
                                                       device=mean.device))
    return (mean * log_ratio).sum()


def with_class_shares(settings: _Settings, shares: tuple[float, ...] | None) -> _Settings:
    """``settings`` (a frozen dataclass with a ``class_prior`` field) with ``shares`` as its
    class prior; as they are when no shares were given."""
    if shares is None:
        return settings
    return replace(settings, class_prior=shares)  # type: ignore[type-var]
