"""Small pieces shared by FedFTG and FedKF: frozen teachers, input shape, divergence and
collapse checks."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from mrtf.errors import FusionError, InputError


@dataclass
class FusionState:
    """What a data-free run (FedFTG or FedKF) trains and records: the student, the generator
    (conditional for FedFTG, unconditional for FedKF), per-step losses, the last batch."""

    student: nn.Module
    generator: nn.Module
    history: list[dict[str, float]] = field(default_factory=list)
    last_batch: torch.Tensor | None = None


def image_shape_of(meta) -> tuple[int, int, int]:
    """(C, H, W) of a received model's input, from ``arch_kwargs`` (in_channels, image_size).

    ``meta`` is a :class:`mrtf.io.bundles.BundleMeta`. Generators make images, so data-free
    fusion needs image models; anything else is an InputError.
    """
    kw = meta.arch_kwargs
    if "image_size" not in kw:
        raise InputError(f"data-free fusion generates images, but {meta.arch!r} declares no "
                         "image_size in mrtf.arch_kwargs (not an image model?)")
    size = int(kw["image_size"])
    return int(kw.get("in_channels", 1)), size, size


def freeze(model: nn.Module) -> nn.Module:
    """Eval mode and ``requires_grad=False`` for every parameter; gradients still flow
    *through* the model to its input (to the generator)."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def check_finite(losses: Mapping[str, float], where: str) -> None:
    """Raise FusionError when any loss is NaN or infinite (nothing has been written)."""
    bad = [k for k, v in losses.items() if not math.isfinite(v)]
    if bad:
        raise FusionError(f"{where}: {', '.join(bad)} is {losses[bad[0]]} (the run diverged; "
                          "try a smaller learning rate)")


def mean_pairwise_distance(x: torch.Tensor) -> float:
    """Mean over pairs i ≠ j of mean|x_i − x_j| (0 when every sample is identical)."""
    flat = x.detach().flatten(1).float()
    n = flat.shape[0]
    if n < 2:
        return float("nan")
    dist = torch.cdist(flat, flat, p=1) / flat.shape[1]
    return float(dist.sum() / (n * (n - 1)))


def collapse_warning(x: torch.Tensor, tol: float, method: str) -> list[str]:
    """A warning when the generated batch is (nearly) identical: mode collapse."""
    d = mean_pairwise_distance(x)
    if math.isfinite(d) and d < tol:
        return [f"{method}: the generator collapsed (generated samples are nearly identical, "
                f"mean pairwise |x_i - x_j| = {d:.2e} < {tol:g}); the fused model learned "
                "from little variety: check the result, try another seed or more steps"]
    return []


class CollapseWatch:
    """Checks the generated batch every ``every`` steps while training: two checks in a row
    with (nearly) identical images (mean pairwise |x_i - x_j| < ``tol``) stop the run with a
    FusionError, minutes into it rather than after it (the sample grid then shows one image
    in every row and the fused model learned from one input)."""

    def __init__(self, total: int, tol: float, method: str) -> None:
        self.total, self.tol, self.method = total, tol, method
        self.every = max(25, total // 20)
        self.hits = 0

    def check(self, step: int, batch: torch.Tensor | None) -> None:
        if batch is None or (step + 1) % self.every or step + 1 >= self.total:
            return
        d = mean_pairwise_distance(batch)
        self.hits = self.hits + 1 if math.isfinite(d) and d < self.tol else 0
        if self.hits >= 2:
            raise FusionError(
                f"{self.method}: the generator collapsed by step {step + 1} of {self.total} "
                f"(every generated image is nearly the same: mean |x_i - x_j| = {d:.1e}); "
                "stopped early and nothing was written. Try another --seed, --datafree "
                "fedftg (needs label counts), or refine with --data")


def stack_logits(models: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """(K, B, C): every model's logits on the same batch."""
    return torch.stack([m(x) for m in models])
