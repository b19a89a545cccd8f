"""Distillation on the target set (MrTF Eq. 1-2 / Eq. 8): minimise KL(targets ‖ σ(student)).

The student is in **train mode** while it distils (as in the authors' code): BatchNorm layers
normalise with the statistics of the target minibatches and their running statistics move
toward the target set, which is the data the refined model will label (transductive). Dropout
is active too. It is returned in eval mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import tqdm
from torch import nn

from mrtf.device import pick_device
from mrtf.errors import FusionError
from mrtf.models import has_batchnorm
from mrtf.refinery.augment import Jitter, applies, jitter
from mrtf.refinery.placement import kept_home
from mrtf.refinery.variants import VARIANTS
from mrtf.schedule import FOREACH, adam

#: the distillation's default schedule: optimiser steps, and target rows per step (the
#: refinery's, the simulator's refinery methods' and the Flower config's defaults read these)
STEPS = 500
BATCH_SIZE = 64
#: offset of the jitter's random stream from the distillation seed
JITTER_STREAM = 7919


@dataclass(frozen=True)
class DistillSettings:
    """Optimiser settings. paper: Adam lr 3e-4 (Sect. 5); reference: Adam lr 1e-3, weight
    decay 1e-6, cosine schedule to 0, gradient-norm clip 100."""

    lr: float
    weight_decay: float
    cosine: bool
    clip: float | None

    @classmethod
    def for_variant(cls, variant: str, lr: float | None = None) -> DistillSettings:
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if variant == "paper":
            return cls(lr=3e-4 if lr is None else lr, weight_decay=0.0, cosine=False, clip=None)
        return cls(lr=1e-3 if lr is None else lr, weight_decay=1e-6, cosine=True, clip=100.0)


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """-Σ_c t_c log σ(z)_c, mean over the batch: KL(t ‖ σ(z)) + H(t) (Eq. 8), same gradient as
    the KL of Eq. 1; also defined for the reference variant's unnormalised targets."""
    return -(targets * F.log_softmax(logits, dim=1)).sum(1).mean()


def _batches(m: int, steps: int, batch_size: int, gen: torch.Generator):
    """Index batches: passes over random permutations of range(m) (a new one when exhausted)."""
    batch = min(batch_size, m)
    order, cursor = torch.randperm(m, generator=gen), 0
    for _ in range(steps):
        if cursor + batch > m:
            order, cursor = torch.randperm(m, generator=gen), 0
        yield order[cursor:cursor + batch].numpy()
        cursor += batch


def gather_rows(source, rows: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """``source`` rows at sorted unique ``rows``, read in one sequential streaming pass.

    Random minibatches straight from HDF5 cost one scattered read each (measured here: about
    10 ms per 64-row batch, more than half a LeNet step); one pass that keeps only the rows
    the steps will use costs one read of the file, and memory for at most steps × batch rows.
    """
    out = np.empty((len(rows), *source.sample_shape), dtype=np.float32)
    for start, x in source.chunks(chunk):
        lo, hi = np.searchsorted(rows, [start, start + len(x)])
        out[lo:hi] = x[rows[lo:hi] - start]
    return out


@dataclass(frozen=True)
class DistillRun:
    """One distillation's schedule: ``steps`` optimiser steps of ``batch_size`` rows, the
    variant's optimiser (``lr`` None → its default, :class:`DistillSettings`), ``seed``
    (batches, dropout, jitter), and ``augment``: the jitter of the student's image inputs
    (augment.py; None or non-image samples: none)."""

    steps: int = STEPS
    batch_size: int = BATCH_SIZE
    lr: float | None = None
    seed: int = 0
    variant: str = "paper"
    augment: Jitter | None = None


def distill(student: nn.Module, source, targets: np.ndarray, run: DistillRun | None = None,
            device: torch.device | str | None = None, progress: bool = False,
            **schedule: Any) -> nn.Module:
    """Eq. 1-2: ``run.steps`` optimiser steps on random minibatches of the target set.

    student : module refined in place (on ``device`` while it trains); returned in eval mode
        on the device it came on (also when the loss diverges: issue 36).
    source : H5Dataset / ArraySource (M rows); the rows the steps use are read in one
        streaming pass (:func:`gather_rows`). targets (M, C) float32.
    run : the schedule (:class:`DistillRun`); ``schedule`` keywords (steps=, batch_size=,
        lr=, seed=, variant=, augment=) replace its fields.
    Deterministic given the seed. Raises FusionError when the loss is NaN or infinite.
    """
    run = replace(run or DistillRun(), **schedule)
    steps, batch_size, seed, augment = run.steps, run.batch_size, run.seed, run.augment
    dev = pick_device(device)
    with kept_home(student):
        cfg = DistillSettings.for_variant(run.variant, run.lr)
        student = student.to(dev).train()
        opt = adam(student.parameters(), cfg.lr, cfg.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=0.0) \
            if cfg.cosine and steps > 0 else None
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # dropout masks
        tgt = torch.from_numpy(np.ascontiguousarray(targets, dtype=np.float32))
        batches = list(_batches(len(source), steps, batch_size, gen))
        rows = np.unique(np.concatenate(batches)) if batches else np.empty(0, np.int64)
        data = gather_rows(source, rows)
        if augment is not None and not applies(tuple(source.sample_shape)):
            augment = None
        # its own stream, so the batches and dropout masks are those of an unjittered run
        moves = torch.Generator().manual_seed(seed + JITTER_STREAM)
        bar = _bar(steps, progress)
        for step, idx in enumerate(batches):
            if len(idx) < 2 and has_batchnorm(student):
                continue  # BatchNorm cannot train on a single sample
            x = torch.from_numpy(data[np.searchsorted(rows, idx)]).to(dev)
            if augment is not None:
                x = jitter(x, moves, augment)
            loss = soft_cross_entropy(student(x), tgt[idx].to(dev))
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FusionError(f"distillation diverged: loss is {value} at step {step}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.clip:
                nn.utils.clip_grad_norm_(student.parameters(), cfg.clip, foreach=FOREACH)
            opt.step()
            if sched is not None:
                sched.step()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{value:.4f}", refresh=False)
        if bar is not None:
            bar.close()
        return student.eval()


def _bar(steps: int, progress: bool):
    if not progress:
        return None
    # tqdm.tqdm looked up now: mrtf.progress.log_lines swaps it for plain log lines
    return tqdm.tqdm(total=steps, desc="distill", unit="step", leave=False)

