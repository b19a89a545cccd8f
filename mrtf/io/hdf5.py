"""HDF5 datasets (``x``, optional ``y`` and ``ids``) and label files (README "Formats").

Datasets are read in chunks, so M may exceed memory. ``x`` is float32, or uint8 scaled by
1/255. ``y`` is only ever used for scoring.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import h5py
import numpy as np

import mrtf
from mrtf.errors import InputError, first_line
from mrtf.io.atomic import atomic_path
from mrtf.io.limits import (
    MAX_ABS_X,
    MAX_CLASSES,
    MAX_SAMPLE_VALUES,
    check_memory,
    check_regular_file,
)


def _open(path: str | os.PathLike) -> h5py.File:
    p = Path(path)
    check_regular_file(p, "HDF5 file", max_bytes=1 << 62)  # a FIFO or device is not opened
    try:
        return h5py.File(p, "r")
    except OSError as exc:
        raise InputError(f"{p}: not a readable HDF5 file ({first_line(exc)})"
                         ) from None


def _plain(p: Path, name: str, ds: h5py.Dataset) -> None:
    """Refuse a virtual or external dataset: it reads other files (any raw file, for external
    storage) and can declare far more rows than its file holds."""
    if ds.is_virtual or ds.external:
        raise InputError(f"{p}: '{name}' is a {'virtual' if ds.is_virtual else 'external'} "
                         "dataset (it reads other files); store it as a plain dataset")


@contextlib.contextmanager
def _reading(p: Path, name: str) -> Iterator[None]:
    """A read error inside the file (corrupt compressed chunks, truncation) is one line."""
    try:
        yield
    except OSError as exc:
        raise InputError(f"{p}: cannot read '{name}' (corrupt or truncated file: "
                         f"{first_line(exc)})") from None


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
        _plain(p, "x", x)
        if x.ndim < 2:
            raise InputError(f"{p}: 'x' must be (M, ...) with at least 2 dims, got {x.shape}")
        # integers other than uint8 have no agreed scale (0-255? 0-65535?): refused rather
        # than read unscaled; float16/float64 are read as float32
        if x.dtype not in (np.float32, np.float64, np.float16, np.uint8):
            raise InputError(f"{p}: 'x' has dtype {x.dtype}; expected float32 (float16/64 are "
                             "converted) or uint8 pixels (scaled by 1/255)")
        if x.shape[0] == 0:
            raise InputError(f"{p}: 'x' is empty (0 samples)")
        per_row = int(np.prod(x.shape[1:], dtype=np.float64))
        if per_row > MAX_SAMPLE_VALUES:
            raise InputError(f"{p}: one sample of 'x' holds {per_row:,} values, more than the "
                             f"{MAX_SAMPLE_VALUES:,} any mrtf model takes")
        for key in ("y", "ids"):
            if key in f:
                if not isinstance(f[key], h5py.Dataset) or f[key].ndim == 0:
                    raise InputError(f"{p}: '{key}' must be an array with one row per sample")
                _plain(p, key, f[key])
                if f[key].shape[0] != x.shape[0]:
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
        if not self.has_labels:
            return None
        with _reading(self.path, "y"):
            y = self._file["y"][:]
        if y.dtype.kind == "u" and y.size and int(y.max()) > np.iinfo(np.int64).max:
            raise InputError(f"{self.path}: 'y' holds values beyond int64")
        return y.astype(np.int64)

    def ids(self) -> np.ndarray | None:
        """The samples' ids (file names as ``str``, or numbers), or None."""
        if "ids" not in self._file:
            return None
        with _reading(self.path, "ids"):
            return read_ids(self._file["ids"])

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start, stop) of ``x`` as float32 (uint8 scaled by 1/255)."""
        with _reading(self.path, "x"):
            x = self._file["x"][start:stop]
        return self._as_float(x)

    def _as_float(self, x: np.ndarray) -> np.ndarray:
        if x.dtype == np.uint8:
            return x.astype(np.float32) / 255.0
        with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf: refused
            x = x.astype(np.float32, copy=False)
        if not np.isfinite(x).all():
            raise InputError(f"{self.path}: 'x' holds NaN or infinite values (or values beyond "
                             "float32's range)")
        if x.size and float(np.abs(x).max()) > MAX_ABS_X:
            raise InputError(f"{self.path}: 'x' holds values up to {float(np.abs(x).max()):.3g}"
                             f", beyond the ±{MAX_ABS_X:.0e} mrtf accepts (the forward pass "
                             "would overflow float32); rescale the data")
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
        with _reading(self.path, "x"):
            x = self._file["x"][uniq]
        x = self._as_float(x)
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
                  ids: np.ndarray | None = None, attrs: dict[str, Any] | None = None,
                  atomic: bool = True) -> Path:
    """Write a dataset file atomically. ``x`` (M, ...) float32 or uint8; ``y`` (M,) int64.

    ``atomic=False``: ``path`` is already a temporary file (see :mod:`mrtf.io.outputs`)."""
    x = np.asarray(x)
    if x.shape[0] == 0:
        raise InputError(f"{path}: refusing to write an empty dataset")
    if x.dtype != np.uint8:
        x = x.astype(np.float32, copy=False)
    out = Path(path)
    with atomic_path(out, atomic) as tmp, h5py.File(tmp, "w") as f:
        chunk_rows = max(1, min(len(x), (1 << 20) // max(1, x[0].nbytes)))
        f.create_dataset("x", data=x, chunks=(chunk_rows, *x.shape[1:]))
        if y is not None:
            f.create_dataset("y", data=np.asarray(y, dtype=np.int64))
        if ids is not None:
            write_ids(f, ids)
        for key, value in (attrs or {}).items():
            f.attrs[key] = value if isinstance(value, (int, float, str)) else json.dumps(value)
    return out


def write_ids(f: h5py.File, ids: Any) -> None:
    """``ids`` as an HDF5 dataset: text (file names) as UTF-8 strings, numbers as they are."""
    arr = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids)
    if arr.dtype.kind in "OUS":
        text = [v.decode() if isinstance(v, bytes) else str(v) for v in arr.tolist()]
        f.create_dataset("ids", data=np.array(text, dtype=object),
                         dtype=h5py.string_dtype("utf-8"))
    else:
        f.create_dataset("ids", data=arr)


def read_ids(ds: h5py.Dataset) -> np.ndarray:
    """An ``ids`` dataset: strings come back as ``str`` (object array), numbers as numbers."""
    if h5py.check_string_dtype(ds.dtype) is not None:
        return ds.asstr()[:]
    if ds.dtype.kind == "S":
        return np.array([v.decode(errors="replace") for v in ds[:].tolist()], dtype=object)
    return ds[:]


@dataclass
class LabelSet:
    """Labels for M samples: ``labels`` (M,), ``probs`` (M, C), derived confidence/entropy."""

    labels: np.ndarray
    probs: np.ndarray
    ids: np.ndarray | None = None
    attrs: dict[str, Any] | None = None
    #: calibrated confidence (M,) of each label (mrtf.trust.calibration); None: max(probs)
    calibrated: np.ndarray | None = None
    #: (M,) bool, True where the sample was left unlabeled (label -1; mrtf.trust.selective)
    abstained: np.ndarray | None = None
    #: how the confidence was calibrated (written as the ``calibration`` attribute, JSON)
    calibration: dict[str, Any] | None = None

    @classmethod
    def from_probs(cls, probs: np.ndarray, ids: np.ndarray | None = None,
                   confidence: np.ndarray | None = None,
                   abstained: np.ndarray | None = None,
                   calibration: dict[str, Any] | None = None) -> LabelSet:
        """Labels = argmax(probs); -1 where ``abstained``."""
        probs = np.asarray(probs, dtype=np.float32)
        labels = probs.argmax(1).astype(np.int64)
        if abstained is not None:
            abstained = np.asarray(abstained, dtype=bool)
            labels[abstained] = -1
        conf = None if confidence is None else np.asarray(confidence, dtype=np.float32)
        return cls(labels=labels, probs=probs, ids=ids, calibrated=conf, abstained=abstained,
                   calibration=calibration)

    @property
    def confidence(self) -> np.ndarray:
        return self.probs.max(1) if self.calibrated is None else self.calibrated

    @property
    def entropy(self) -> np.ndarray:
        p = np.clip(self.probs, 1e-12, 1.0)
        return -(self.probs * np.log(p)).sum(1).astype(np.float32)


def write_labels(path: str | os.PathLike, labels: LabelSet, method: str,
                 config: dict[str, Any], parties: list[str], atomic: bool = True) -> Path:
    """Write a labels file atomically (temporary file beside the target, then rename).

    Non-finite probabilities (a model whose outputs overflow float32) are refused: they would
    make labels that mean nothing. ``atomic=False``: ``path`` is already a temporary file."""
    bad = sum(int((~np.isfinite(labels.probs[s:s + LABEL_BLOCK])).any(1).sum())
              for s in range(0, len(labels.probs), LABEL_BLOCK))
    if bad:
        raise InputError(f"the model's outputs are not finite for {bad} of {len(labels.probs)} "
                         "samples (its weights or the data overflow float32); no labels written")
    out = Path(path)
    with atomic_path(out, atomic) as tmp, h5py.File(tmp, "w") as f:
        _write_label_columns(f, labels)
        write_ids(f, labels.ids if labels.ids is not None else np.arange(len(labels.labels)))
        f.attrs["mrtf_version"] = mrtf.__version__
        f.attrs["method"] = method
        f.attrs["config"] = json.dumps(config, sort_keys=True, default=str)
        f.attrs["parties"] = json.dumps(parties)
        f.attrs["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        if labels.abstained is not None:  # label -1 marks these rows (selective labeling)
            f.create_dataset("abstained", data=labels.abstained.astype(np.uint8))
        if labels.calibration is not None:
            f.attrs["calibration"] = json.dumps(labels.calibration, sort_keys=True,
                                                default=float)
    return out


#: rows per block when a labels file is written: its temporaries (entropy, confidence) stay
#: a block's size however many samples there are
LABEL_BLOCK = 65_536


def _write_label_columns(f: h5py.File, labels: LabelSet) -> None:
    """labels, probs, confidence and entropy; the (M,) columns computed a block of rows at a
    time, so their (M, C) temporaries stay a block's size. (Each column is written whole, by
    ``create_dataset(data=...)``: an h5py dataset written by slices whose write failed (disk
    full) was kept alive by the traceback and crashed the interpreter at exit in a test.)"""
    m = len(labels.probs)
    conf = np.empty(m, dtype=np.float32)
    ent = np.empty(m, dtype=np.float32)
    for s in range(0, m, LABEL_BLOCK):
        part = replace(labels, labels=labels.labels[s:s + LABEL_BLOCK], ids=None,
                       probs=np.asarray(labels.probs[s:s + LABEL_BLOCK], dtype=np.float32))
        conf[s:s + len(part.probs)] = part.confidence
        ent[s:s + len(part.probs)] = part.entropy
    f.create_dataset("labels", data=labels.labels.astype(np.int64, copy=False))
    f.create_dataset("probs", data=np.asarray(labels.probs, dtype=np.float32))
    f.create_dataset("confidence", data=conf)
    f.create_dataset("entropy", data=ent)


def read_labels(path: str | os.PathLike) -> LabelSet:
    """Read a labels file written by :func:`write_labels`."""
    p = Path(path)
    with _open(p) as f:
        if "labels" not in f or not isinstance(f["labels"], h5py.Dataset):
            raise InputError(f"{p}: has no dataset 'labels' (not an mrtf labels file)")
        for key in ("labels", "probs", "ids", "confidence", "abstained"):
            if key in f:
                if not isinstance(f[key], h5py.Dataset):
                    raise InputError(f"{p}: '{key}' is not a dataset")
                _plain(p, key, f[key])
        lab = f["labels"]
        if lab.ndim != 1 or lab.dtype.kind not in "iu" or lab.shape[0] == 0:
            raise InputError(f"{p}: 'labels' must be a non-empty 1-d integer array")
        if "probs" in f and (f["probs"].ndim != 2 or f["probs"].shape[0] != lab.shape[0]
                             or not 2 <= f["probs"].shape[1] <= MAX_CLASSES):
            raise InputError(f"{p}: 'probs' must be (M, C) with M = {lab.shape[0]} rows and "
                             f"2 <= C <= {MAX_CLASSES}, got {f['probs'].shape}")
        declared = f["probs"].shape[1] if "probs" in f else 1
        check_memory(lab.shape[0] * (declared + 3) * 8, f"reading {p.name}")
        with _reading(p, "labels"):
            raw = lab[:]
            probs = f["probs"][:].astype(np.float32) if "probs" in f else None
            ids = read_ids(f["ids"]) if "ids" in f else None
            conf = _column(p, f, "confidence", lab.shape[0], np.float32)
            abst = _column(p, f, "abstained", lab.shape[0], bool)
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    c = probs.shape[1] if probs is not None else MAX_CLASSES
    if abst is not None:  # -1 is the label of an abstained row, and only of one
        if not np.array_equal(raw == -1, abst):
            raise InputError(f"{p}: 'abstained' does not match the rows labeled -1")
        raw = np.where(abst, 0, raw)
    if int(raw.min()) < 0 or int(raw.max()) >= c:
        raise InputError(f"{p}: 'labels' holds {int(raw.min())}..{int(raw.max())}, outside "
                         f"the classes 0..{c - 1}")
    labels = raw.astype(np.int64)
    if probs is None:
        check_memory(len(labels) * (int(labels.max()) + 1) * 4, f"expanding {p.name}")
        probs = np.eye(int(labels.max()) + 1, dtype=np.float32)[labels]
    if abst is not None:
        labels[abst] = -1
    calibration = None
    if "calibration" in attrs:
        try:
            calibration = json.loads(attrs["calibration"])
        except (TypeError, ValueError):
            raise InputError(f"{p}: attribute 'calibration' is not JSON") from None
    if conf is not None and not (np.isfinite(conf).all() and (conf >= 0).all()
                                 and (conf <= 1).all()):
        raise InputError(f"{p}: 'confidence' must hold values in [0, 1]")
    # an uncalibrated file's confidence is max(probs): keep it derived, as before
    return LabelSet(labels=labels, probs=probs, ids=ids, attrs=attrs,
                    calibrated=conf if calibration is not None else None, abstained=abst,
                    calibration=calibration)


def _column(p: Path, f, key: str, m: int, dtype) -> np.ndarray | None:
    """An optional (M,) column of a labels file, or None."""
    if key not in f:
        return None
    ds = f[key]
    if ds.ndim != 1 or ds.shape[0] != m or ds.dtype.kind not in "biuf":
        raise InputError(f"{p}: '{key}' must be a 1-d numeric array of {m} rows")
    return ds[:].astype(dtype)


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
