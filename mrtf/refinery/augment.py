"""Small random shifts and rotations of the student's inputs while it distils (Eq. 1-2).

Why: on a 1,000-image target the student sees each image ~32 times in 500 steps of 64 and
fits the targets' noise along with their signal. Jittering its inputs (each step sees a
slightly moved copy; the target distribution stays the clean image's) makes it learn a
function that is smooth under the moves a digit tolerates, so where the consensus is wrong on
a few images and right on their near neighbours, the student follows the neighbours. This is
the input noise of Noisy Student (Xie et al. 2020) and the weak augmentation of FixMatch (Sohn
et al. 2020), applied to distillation, not to the teachers: the targets are computed once on
the clean images.

Measured on the label-quality grid and the 27 fresh sets (bench/label_quality.py; README,
"Input jitter while distilling"): shifts up to 2/28 of the side and rotations up to 10° gave
+0.9 / +0.5 points (grid / fresh), better in 34 of the 38 sets it changed. In the scratch
study before it, larger moves and a zoom gained the same within 0.3 points; jittering SHOT's
inputs too (the adapt branch) did not help.
The paper's methods do not jitter (they reproduce the paper).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mrtf.errors import InputError


@dataclass(frozen=True)
class Jitter:
    """shift: the largest translation, as a fraction of the image's side (2 px at 28 px);
    rotate: the largest rotation in degrees. Each is drawn uniformly per image and step."""

    shift: float = 2 / 28
    rotate: float = 10.0

    def __post_init__(self) -> None:
        if not 0 <= self.shift <= 0.5:
            raise InputError(f"jitter shift must be in [0, 0.5] of the image side, "
                             f"got {self.shift}")
        if not 0 <= self.rotate <= 180:
            raise InputError(f"jitter rotation must be in [0, 180] degrees, got {self.rotate}")


#: what the adaptive method uses (``RefineConfig.augment``)
DEFAULT_JITTER = Jitter()


def applies(sample_shape: tuple[int, ...]) -> bool:
    """Jitter needs images (C, H, W); flat feature vectors have no geometry to move."""
    return len(sample_shape) == 3 and min(sample_shape[1:]) >= 2


def jitter(x: torch.Tensor, gen: torch.Generator, spec: Jitter = DEFAULT_JITTER
           ) -> torch.Tensor:
    """A moved copy of the image batch ``x`` (N, C, H, W): per image a uniform translation
    within ±``spec.shift`` of the side and a rotation within ±``spec.rotate``° about the
    centre, bilinear, the border pixels extended (a digit's background). The random numbers
    come from ``gen`` (CPU), so the moves do not depend on the device or the thread count."""
    n = x.shape[0]
    angle = (torch.rand(n, generator=gen) * 2 - 1) * math.radians(spec.rotate)
    # affine_grid works in [-1, 1] coordinates: a fraction f of the side is 2f
    move = (torch.rand(n, 2, generator=gen) * 2 - 1) * 2 * spec.shift
    cos, sin = torch.cos(angle), torch.sin(angle)
    theta = torch.stack([torch.stack([cos, -sin, move[:, 0]], 1),
                         torch.stack([sin, cos, move[:, 1]], 1)], 1)
    grid = F.affine_grid(theta.to(x.device, x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
