"""A party's own data on its SuperNode: the HDF5 shard named by ``--node-config 'data="..."'``,
read whole (a party's shard is its training set) and checked against the run's model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mrtf.errors import InputError
from mrtf.io.hdf5 import H5Dataset

#: a shard larger than this is refused rather than read into memory (float32 values)
MAX_SHARD_VALUES = 1 << 30


@dataclass
class Shard:
    party: int
    x: torch.Tensor  # (n, C, H, W) float32
    y: torch.Tensor  # (n,) int64

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.x.shape[1:])


def party_id(node_config: dict[str, Any]) -> int:
    """The party's index in the federation: ``partition-id`` of the node config."""
    pid = node_config.get("partition-id")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < 0:
        raise InputError(f"node config: partition-id must be an integer >= 0, got {pid!r}")
    return pid


def load_shard(node_config: dict[str, Any]) -> Shard:
    """The node's shard (x, y); one line for a missing, unreadable or unlabeled file."""
    path = node_config.get("data")
    if not isinstance(path, str) or not path:
        raise InputError("node config: data (the party's .h5 shard) is not set")
    pid = party_id(node_config)
    with H5Dataset(path) as ds:
        if not ds.has_labels:
            raise InputError(f"{path}: has no 'y'; a party trains on labeled data")
        n, shape = len(ds), ds.sample_shape
        if n * int(np.prod(shape, dtype=np.int64)) > MAX_SHARD_VALUES:
            raise InputError(f"{path}: {n} samples of {shape} are more than a shard may hold")
        x, y = ds.read(0, n), ds.labels()
    return Shard(pid, torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),
                 torch.from_numpy(np.asarray(y, dtype=np.int64)))


def check_fits(shard: Shard, image_shape: tuple[int, ...], num_classes: int) -> None:
    """The shard's samples have the model's input shape and labels within its classes."""
    if shard.sample_shape != tuple(image_shape):
        raise InputError(f"party {shard.party}: its data has samples of shape "
                         f"{shard.sample_shape}, the run's model takes {tuple(image_shape)}")
    lo, hi = int(shard.y.min()), int(shard.y.max())
    if lo < 0 or hi >= num_classes:
        raise InputError(f"party {shard.party}: its labels span {lo}..{hi}, outside the run's "
                         f"{num_classes} classes")
