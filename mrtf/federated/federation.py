"""A seed's federation: the dataset split over K clients (non-IID) and the server's unlabeled
target set, a held-out part of the same dataset (in-domain) or of another one (cross-domain)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from mrtf.errors import InputError
from mrtf.federated.fairness import split_local_test
from mrtf.io.hdf5 import write_dataset
from mrtf.models import image_kwargs

if TYPE_CHECKING:
    from mrtf.federated.run_config import RunConfig


@dataclass
class Federation:
    """Prepared data: client index sets into (x, y), and the server's target set."""

    x: torch.Tensor
    y: torch.Tensor
    parts: list[np.ndarray]
    target_x: torch.Tensor
    target_y: torch.Tensor
    num_classes: int
    arch_kwargs: dict
    # each client's local test part (indices into x, y), when the run holds one out
    test_parts: list[np.ndarray] | None = None
    source: str = ""  # the dataset's name or file


def prepare_federation(cfg: RunConfig, seed: int) -> Federation:
    """Load the dataset, cut off the target set, split the rest over the clients; hold out
    each client's local test part (``cfg.local_test``); for a cross-domain run replace the
    target set by held-out samples of ``cfg.target``, resized and channel-converted to the
    source's shape."""
    from mrtf.data import load_dataset, split_clients, train_target_split

    ds = load_dataset(cfg.dataset, cfg.image_size, cfg.channels)
    train_idx, target_idx = train_target_split(len(ds.y), cfg.target_size, seed)
    y_train = ds.y[train_idx]
    parts = split_clients(y_train, cfg.clients, cfg.split, seed, ds.num_classes)
    c, s = ds.x.shape[1], ds.x.shape[-1]
    fed = Federation(
        x=torch.from_numpy(ds.x[train_idx]), y=torch.from_numpy(y_train),
        parts=parts, target_x=torch.from_numpy(ds.x[target_idx]),
        target_y=torch.from_numpy(ds.y[target_idx]), num_classes=ds.num_classes,
        arch_kwargs=image_kwargs(cfg.arch, c, s, cfg.norm), source=str(cfg.dataset),
    )
    if cfg.local_test > 0:
        fed.parts, fed.test_parts = split_local_test(fed.parts, cfg.local_test, seed)
    if cfg.cross_domain:
        _cross_domain_target(fed, cfg, seed)
    return fed


def _cross_domain_target(fed: Federation, cfg: RunConfig, seed: int) -> None:
    from mrtf.data import adapt_images, load_dataset, train_target_split

    c, h, w = fed.x.shape[1:]
    ds = load_dataset(cfg.target)
    if ds.x.ndim != 4 or ds.x.shape[-1] != ds.x.shape[-2] or h != w:
        raise InputError(f"target {cfg.target!r} images {tuple(ds.x.shape[1:])} do not fit the "
                         f"source's models ({c}×{h}×{w}): only square images can be resized")
    if ds.num_classes > fed.num_classes:
        raise InputError(f"target {cfg.target!r} has {ds.num_classes} classes but the source's "
                         f"models predict {fed.num_classes}")
    x = adapt_images(ds.x, h, c)
    n = len(ds.y)
    _, idx = train_target_split(n, min(cfg.target_size, n - 1), seed)
    fed.target_x = torch.from_numpy(np.ascontiguousarray(x[idx]))
    fed.target_y = torch.from_numpy(ds.y[idx].astype(np.int64))
    fed.source = str(cfg.target)


def check_target_fits(fed: Federation, arch: str) -> None:
    """Refuse a target set the federation's models cannot take (before any training)."""
    from mrtf.errors import first_line
    from mrtf.models import build_model

    model = build_model(arch, fed.num_classes, **fed.arch_kwargs).eval()
    try:
        with torch.inference_mode():
            logits = model(fed.target_x[:1])
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        raise InputError(f"target images of shape {tuple(fed.target_x.shape[1:])} do not fit "
                         f"the {arch} models ({first_line(exc)})") from None
    if logits.shape[-1] != fed.num_classes:
        raise InputError("the target does not fit the source's models")


def export_target(fed: Federation, path: str | Path) -> Path:
    """Write the server's target set: ``x`` and ``y`` (for scoring only). ``fed`` may also be
    a simulation's result (its federation is written)."""
    fed = getattr(fed, "federation", fed)
    return write_dataset(path, fed.target_x.numpy(), fed.target_y.numpy(),
                         ids=np.arange(len(fed.target_y)), attrs={"source": fed.source})
