"""HDF5 datasets (``x``, optional ``y`` and ``ids``) and label files (DESIGN.md formats).

Datasets are read in chunks, so M may exceed memory. ``x`` is float32, or uint8 scaled by
1/255. ``y`` is only ever used for scoring.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import h5py
import numpy as np

import mrtf
from mrtf.errors import InputError
from mrtf.io.atomic import atomic_path


def _open(path: str | os.PathLike) -> h5py.File:
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if not p.is_file():
        raise InputError(f"{p}: not a file")
    try:
        return h5py.File(p, "r")
    except OSError as exc:
        raise InputError(f"{p}: not a readable HDF5 file ({str(exc).splitlines()[0][:120]})"
                         ) from None


class H5Dataset:
    """Read-only view of an HDF5 dataset file.

    Parameters
    ----------
    path : file with ``x`` of shape (M, ...) float32 or uint8, optional ``y`` (M,) int, ``ids``.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._file = _open(self.path)
        try:
            self._check()
        except BaseException:
            self._file.close()
            raise

    def _check(self) -> None:
        f, p = self._file, self.path
        if "x" not in f or not isinstance(f["x"], h5py.Dataset):
            raise InputError(f"{p}: has no dataset 'x' (the images to label)")
        x = f["x"]
        if x.ndim < 2:
            raise InputError(f"{p}: 'x' must be (M, ...) with at least 2 dims, got {x.shape}")
        if x.dtype not in (np.float32, np.float64, np.uint8, np.float16, np.int64, np.int32):
            raise InputError(f"{p}: 'x' has dtype {x.dtype}; expected float32 or uint8")
        if x.shape[0] == 0:
            raise InputError(f"{p}: 'x' is empty (0 samples)")
        for key in ("y", "ids"):
            if key in f and f[key].shape[0] != x.shape[0]:
                raise InputError(f"{p}: '{key}' has {f[key].shape[0]} rows but 'x' has "
                                 f"{x.shape[0]}")
        if "y" in f and (f["y"].ndim != 1 or f["y"].dtype.kind not in "iu"):
            raise InputError(f"{p}: 'y' must be a 1-d integer array")

    def __len__(self) -> int:
        return int(self._file["x"].shape[0])

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self._file["x"].shape[1:])

    @property
    def has_labels(self) -> bool:
        return "y" in self._file

    def labels(self) -> np.ndarray | None:
        """``y`` as int64, or None. For scoring only."""
        return self._file["y"][:].astype(np.int64) if self.has_labels else None

    def ids(self) -> np.ndarray | None:
        return self._file["ids"][:] if "ids" in self._file else None

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start, stop) of ``x`` as float32 (uint8 scaled by 1/255)."""
        x = self._file["x"][start:stop]
        if x.dtype == np.uint8:
            return x.astype(np.float32) / 255.0
        x = x.astype(np.float32, copy=False)
        if not np.isfinite(x).all():
            raise InputError(f"{self.path}: 'x' holds NaN or infinite values")
        return x

    def chunks(self, size: int = 4096) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(start, x_chunk)`` over the whole set in order."""
        for start in range(0, len(self), size):
            yield start, self.read(start, start + size)

    def take(self, indices: np.ndarray) -> np.ndarray:
        """Rows at ``indices`` (any order) as float32; reads them in sorted order."""
        indices = np.asarray(indices, dtype=np.int64)
        order = np.argsort(indices)
        uniq, inverse = np.unique(indices[order], return_inverse=True)
        x = self._file["x"][uniq]
        x = x.astype(np.float32) / 255.0 if x.dtype == np.uint8 else x.astype(np.float32)
        out = np.empty((len(indices), *x.shape[1:]), dtype=np.float32)
        out[order] = x[inverse]
        return out

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> H5Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ArraySource:
    """An in-memory dataset with the same reading interface as :class:`H5Dataset`."""

    def __init__(self, x: np.ndarray, y: np.ndarray | None = None,
                 ids: np.ndarray | None = None) -> None:
        x = np.asarray(x)
        if len(x) == 0:
            raise InputError("the target set is empty (0 samples)")
        self.x = x.astype(np.float32) / 255.0 if x.dtype == np.uint8 else \
            x.astype(np.float32, copy=False)
        self.y, self._ids = y, ids

    def __len__(self) -> int:
        return len(self.x)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    @property
    def has_labels(self) -> bool:
        return self.y is not None

    def labels(self) -> np.ndarray | None:
        return None if self.y is None else np.asarray(self.y, dtype=np.int64)

    def ids(self) -> np.ndarray | None:
        return self._ids

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self.x[start:stop]

    def chunks(self, size: int = 4096) -> Iterator[tuple[int, np.ndarray]]:
        for start in range(0, len(self), size):
            yield start, self.x[start:start + size]

    def take(self, indices: np.ndarray) -> np.ndarray:
        return self.x[np.asarray(indices, dtype=np.int64)]

    def close(self) -> None:
        pass


def read_dataset(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray | None]:
    """Whole dataset in memory: ``(x float32, y int64 or None)``."""
    with H5Dataset(path) as ds:
        return ds.read(), ds.labels()


def write_dataset(path: str | os.PathLike, x: np.ndarray, y: np.ndarray | None = None,
                  ids: np.ndarray | None = None, attrs: dict[str, Any] | None = None) -> Path:
    """Write a dataset file atomically. ``x`` (M, ...) float32 or uint8; ``y`` (M,) int64."""
    x = np.asarray(x)
    if x.shape[0] == 0:
        raise InputError(f"{path}: refusing to write an empty dataset")
    if x.dtype != np.uint8:
        x = x.astype(np.float32, copy=False)
    out = Path(path)
    with atomic_path(out) as tmp, h5py.File(tmp, "w") as f:
        chunk_rows = max(1, min(len(x), (1 << 20) // max(1, x[0].nbytes)))
        f.create_dataset("x", data=x, chunks=(chunk_rows, *x.shape[1:]))
        if y is not None:
            f.create_dataset("y", data=np.asarray(y, dtype=np.int64))
        if ids is not None:
            f.create_dataset("ids", data=np.asarray(ids))
        for key, value in (attrs or {}).items():
            f.attrs[key] = value if isinstance(value, (int, float, str)) else json.dumps(value)
    return out


@dataclass
class LabelSet:
    """Labels for M samples: ``labels`` (M,), ``probs`` (M, C), derived confidence/entropy."""

    labels: np.ndarray
    probs: np.ndarray
    ids: np.ndarray | None = None
    attrs: dict[str, Any] | None = None

    @classmethod
    def from_probs(cls, probs: np.ndarray, ids: np.ndarray | None = None) -> LabelSet:
        probs = np.asarray(probs, dtype=np.float32)
        return cls(labels=probs.argmax(1).astype(np.int64), probs=probs, ids=ids)

    @property
    def confidence(self) -> np.ndarray:
        return self.probs.max(1)

    @property
    def entropy(self) -> np.ndarray:
        p = np.clip(self.probs, 1e-12, 1.0)
        return -(self.probs * np.log(p)).sum(1).astype(np.float32)


def write_labels(path: str | os.PathLike, labels: LabelSet, method: str,
                 config: dict[str, Any], parties: list[str]) -> Path:
    """Write a labels file atomically (temporary file beside the target, then rename)."""
    out = Path(path)
    with atomic_path(out) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("labels", data=labels.labels.astype(np.int64))
        f.create_dataset("probs", data=labels.probs.astype(np.float32))
        f.create_dataset("confidence", data=labels.confidence.astype(np.float32))
        f.create_dataset("entropy", data=labels.entropy)
        if labels.ids is not None:
            f.create_dataset("ids", data=labels.ids)
        f.attrs["mrtf_version"] = mrtf.__version__
        f.attrs["method"] = method
        f.attrs["config"] = json.dumps(config, sort_keys=True, default=str)
        f.attrs["parties"] = json.dumps(parties)
        f.attrs["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return out


def read_labels(path: str | os.PathLike) -> LabelSet:
    """Read a labels file written by :func:`write_labels`."""
    with _open(path) as f:
        if "labels" not in f:
            raise InputError(f"{path}: has no dataset 'labels' (not an mrtf labels file)")
        probs = f["probs"][:] if "probs" in f else None
        labels = f["labels"][:].astype(np.int64)
        ids = f["ids"][:] if "ids" in f else None
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    if probs is None:
        probs = np.eye(int(labels.max()) + 1, dtype=np.float32)[labels]
    return LabelSet(labels=labels, probs=probs, ids=ids, attrs=attrs)


def describe_h5(path: str | os.PathLike) -> dict[str, Any]:
    """Datasets (shape, dtype) and attributes of any HDF5 file, for ``mrtf inspect``."""
    with _open(path) as f:
        datasets: dict[str, Any] = {}

        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                datasets[name] = {"shape": list(obj.shape), "dtype": str(obj.dtype)}

        f.visititems(visit)
        attrs = {k: (v.decode() if isinstance(v, bytes) else
                     v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()}
    return {"path": str(path), "datasets": datasets, "attrs": attrs}
