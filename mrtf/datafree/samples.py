"""A picture of what a generator makes: one row per class, written atomically as a PNG."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from mrtf.datafree.generators import sample_noise
from mrtf.errors import InputError
from mrtf.io.atomic import atomic_path


@torch.no_grad()
def _rows(generator: nn.Module, num_classes: int, per_class: int, seed: int,
          teacher: nn.Module | None) -> list[list[np.ndarray]]:
    """Images (H, W, C) in [0, 1] grouped by class: the conditioning label for a conditional
    generator; the teacher's prediction (or plain order, without a teacher) otherwise."""
    rng = torch.Generator().manual_seed(seed)
    dev = next(generator.parameters()).device
    generator.eval()
    if getattr(generator, "conditional", False):
        y = torch.arange(num_classes).repeat_interleave(per_class)
        x = generator(sample_noise(len(y), generator.noise_dim, rng, dev), y.to(dev))
    else:
        n = num_classes * per_class * (4 if teacher is not None else 1)
        x = generator(sample_noise(n, generator.noise_dim, rng, dev))
        y = (teacher.to(dev).eval()(x).argmax(1).cpu() if teacher is not None
             else torch.arange(num_classes).repeat_interleave(per_class))
    if getattr(getattr(generator, "decoder", None), "activation", "sigmoid") == "tanh":
        x = (x + 1) / 2
    imgs = x.clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy()
    return [[imgs[i] for i in np.flatnonzero(y.numpy() == c)[:per_class]]
            for c in range(num_classes)]


def dump_samples(generator: nn.Module, path_png: str | os.PathLike, num_classes: int,
                 per_class: int = 8, seed: int = 0, teacher: nn.Module | None = None,
                 atomic: bool = True, title: str | None = None) -> Path:
    """Write a grid PNG of generated images (rows = classes) to ``path_png``, atomically.

    For an unconditional (FedKF) generator, rows are the ``teacher``'s predicted classes when a
    teacher is given (empty cells where it predicted that class fewer times), else plain rows.
    Nothing is written when anything fails. ``title`` heads the grid (default: what the rows
    are); the rows are labelled ``class 0``, ``class 1``, ...
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path_png)
    if num_classes < 1 or per_class < 1:
        raise InputError("dump_samples needs num_classes >= 1 and per_class >= 1")
    if not out.parent.is_dir():
        raise InputError(f"{out.parent}: output directory does not exist")
    rows = _rows(generator, num_classes, per_class, seed, teacher)
    if title is None:
        title = ("generated samples, one row per class" if getattr(generator, "conditional",
                                                                   False)
                 else "generated samples, rows: the class the model predicts" if teacher
                 is not None else "generated samples (unconditional generator, no classes)")
    fig, axes = plt.subplots(num_classes, per_class, squeeze=False,
                             figsize=(per_class * 0.8 + 1.0, num_classes * 0.8 + 0.6))
    try:
        for c, row in enumerate(axes):
            for j, ax in enumerate(row):
                ax.set_axis_off()
                if j < len(rows[c]):
                    img = rows[c][j]
                    ax.imshow(img[..., 0] if img.shape[-1] == 1 else img, cmap="gray",
                              vmin=0, vmax=1)
            label = f"class {c}"
            if not rows[c]:
                label += " (none)"
            row[0].text(-0.1, 0.5, label, transform=row[0].transAxes, ha="right",
                        va="center", fontsize=8)
        fig.suptitle(title, fontsize=9)
        fig.subplots_adjust(left=0.2, right=0.98, bottom=0.02,
                            top=1 - 0.45 / (num_classes * 0.8 + 0.6))
        with atomic_path(out, atomic) as tmp:
            fig.savefig(tmp, format="png", dpi=80)
    finally:
        plt.close(fig)
    return out
