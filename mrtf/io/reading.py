"""A target read another way: each image's foreground contrast and/or a zoom about its
centre, with the same reading interface as :class:`~mrtf.io.hdf5.H5Dataset` (the refinery's
input alignment, mrtf/refinery/input_reading.py, chooses the reading).

Why: the parties and the pilot party may have prepared their images differently. The
standard digit sets frame their digits differently (MNIST size-normalises each digit to a
20×20 box centred in 28×28; USPS's 16×16 digits fill their frame, so resized to 28×28 they
are ~40 % larger than any MNIST digit), and MNIST-M draws MNIST's digits as colour
differences over natural-image patches where MNIST has white strokes on black. A network
trained on one preparation misreads the other (docs/benchmarks/input-reading.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

#: the zoom factors accepted (a factor outside would shrink a 28-pixel digit below 14
#: pixels or crop away more than half of it)
MIN_SCALE, MAX_SCALE = 0.5, 2.0
#: the spec word of :func:`foreground`
FOREGROUND = "fg"


def is_image_shape(sample_shape: tuple[int, ...]) -> bool:
    """Whether samples of this shape are images a reading applies to: (C, H, W), H, W ≥ 8."""
    return len(sample_shape) == 3 and sample_shape[1] >= 8 and sample_shape[2] >= 8


def rescale(x: np.ndarray, scale: float) -> np.ndarray:
    """``x`` (N, C, H, W) float32 zoomed by ``scale`` about each image's centre, bilinear.

    ``scale`` < 1 shrinks the content and fills the uncovered border with each image's own
    background, the median of its outermost pixels per channel (0 for MNIST's black
    border, the texture's typical colour for MNIST-M); ``scale`` > 1 enlarges the centre
    and crops the rest. The same shape comes back; ``scale`` = 1 returns ``x`` itself.
    """
    if scale == 1.0 or len(x) == 0:
        return x
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    edge = torch.cat([t[:, :, 0, :], t[:, :, -1, :], t[:, :, :, 0], t[:, :, :, -1]], dim=2)
    fill = edge.median(dim=2).values[:, :, None, None]
    theta = torch.zeros(len(t), 2, 3)
    theta[:, 0, 0] = theta[:, 1, 1] = 1.0 / scale  # output → input coordinates
    grid = F.affine_grid(theta, list(t.shape), align_corners=False)
    out = F.grid_sample(t - fill, grid, mode="bilinear", padding_mode="zeros",
                        align_corners=False) + fill
    return out.numpy()


def foreground(x: np.ndarray) -> np.ndarray:
    """Each image's foreground contrast: every pixel's Euclidean distance, over the channels,
    from the image's dominant colour (the per-channel median of its pixels), divided by the
    image's largest such distance, in every channel. A figure on any background becomes a
    bright figure on black (MNIST's convention): dark strokes on white, or MNIST-M's
    colour-difference strokes over a texture. An image already bright on black comes back
    divided by its maximum; a flat image comes back black."""
    if len(x) == 0:
        return x
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    colour = t.flatten(2).median(dim=2).values[:, :, None, None]
    dist = (t - colour).square().sum(1, keepdim=True).sqrt()
    top = dist.flatten(1).amax(1).clamp_min(1e-6)[:, None, None, None]
    return (dist / top).expand(-1, t.shape[1], -1, -1).contiguous().numpy()


@dataclass(frozen=True)
class Reading:
    """How the target's images are read: ``foreground`` (:func:`foreground`) first, then a
    zoom by ``scale`` (:func:`rescale`). ``Reading()`` reads them as given."""

    scale: float = 1.0
    foreground: bool = False

    def __post_init__(self) -> None:
        if not MIN_SCALE <= self.scale <= MAX_SCALE:
            raise ValueError(f"scale must be in [{MIN_SCALE:g}, {MAX_SCALE:g}], "
                             f"got {self.scale:g}")

    @property
    def as_given(self) -> bool:
        return self.scale == 1.0 and not self.foreground

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``x`` (N, C, H, W) read this way."""
        return rescale(foreground(x) if self.foreground else x, self.scale)

    def spec(self) -> str:
        """The reading as text: '0.7', 'fg', 'fg:0.7', or '1' as given (:meth:`parse`)."""
        if not self.foreground:
            return f"{self.scale:g}"
        return FOREGROUND if self.scale == 1.0 else f"{FOREGROUND}:{self.scale:g}"

    def describe(self) -> str:
        """In words, for the run's notes."""
        parts = (["as each pixel's contrast to the image's dominant colour"]
                 if self.foreground else []) + \
            ([f"at {self.scale:g}× its size"] if self.scale != 1.0 else [])
        return " and ".join(parts) or "as given"

    @classmethod
    def parse(cls, text: str) -> Reading:
        """A reading of :meth:`spec`'s form (ValueError with the accepted forms otherwise)."""
        words = str(text).strip().lower().split(":")
        fg = words[0] == FOREGROUND
        rest = words[1:] if fg else words
        try:
            if len(rest) > 1 or (not fg and not rest[0]):
                raise ValueError
            return cls(float(rest[0]) if rest else 1.0, fg)
        except (ValueError, IndexError):
            raise ValueError(f"a reading is FACTOR, {FOREGROUND} or {FOREGROUND}:FACTOR with "
                             f"FACTOR in [{MIN_SCALE:g}, {MAX_SCALE:g}], got "
                             f"{str(text)[:40]!r}") from None


class ReadSource:
    """``source`` with every image read through ``reading``; its labels, ids and length are
    the source's. Reads what the source reads, when it reads it."""

    def __init__(self, source: Any, reading: Reading) -> None:
        if not is_image_shape(tuple(source.sample_shape)):
            raise ValueError(f"samples of shape {tuple(source.sample_shape)} are not images")
        self.source, self.reading = source, reading
        self.reads_from_disk = bool(getattr(source, "reads_from_disk", False))

    def __len__(self) -> int:
        return len(self.source)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.source.sample_shape)

    @property
    def has_labels(self) -> bool:
        return bool(self.source.has_labels)

    def labels(self) -> np.ndarray | None:
        return self.source.labels()

    def ids(self) -> np.ndarray | None:
        return self.source.ids()

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self.reading.apply(self.source.read(start, stop))

    def chunks(self, size: int = 4096) -> Iterator[tuple[int, np.ndarray]]:
        for start, x in self.source.chunks(size):
            yield start, self.reading.apply(x)

    def take(self, indices: np.ndarray) -> np.ndarray:
        return self.reading.apply(self.source.take(indices))

    def close(self) -> None:
        pass  # the source is the caller's to close
