"""HDF5 datasets (``x``, optional ``y`` and ``ids``) and label files (README "Formats").

Datasets are read in chunks, so M may exceed memory. ``x`` is float32, or uint8 scaled by
1/255. ``y`` is only ever used for scoring.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mrtf.errors import InputError, first_line
from mrtf.io.atomic import atomic_path
from mrtf.io.h5checks import (
    check_ids_header,
    check_y_header,
    read_ids,
    root_dataset,
    y_range,
)
from mrtf.io.limits import (
    MAX_ABS_X,
    MAX_SAMPLE_VALUES,
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

    reads_from_disk = True  # chunked loops read it ahead (mrtf.io.read_ahead)

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._file = _open(self.path)
        try:
            self._check()
        except BaseException:
            self._file.close()
            raise

    def _check(self) -> None:
        """The header: what ``x`` is (not a link, a plain dataset, its dtype and sample size),
        and the dtype and shape of ``y`` and ``ids``. Nothing is read but metadata."""
        f, p = self._file, self.path
        x = root_dataset(p, f, "x")
        if x is None:
            raise InputError(f"{p}: has no dataset 'x' (the images to label)")
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
        y, ids = root_dataset(p, f, "y"), root_dataset(p, f, "ids")
        if y is not None:
            check_y_header(p, y, x.shape[0])
        if ids is not None:
            check_ids_header(p, ids, x.shape[0])

    def check_columns(self, num_classes: int | None = None, of: str = "") -> None:
        """Read ``y`` and ``ids`` in blocks and refuse bad values: a ``y`` outside
        0..num_classes-1 (``of`` names what gave the class count), an id that is not UTF-8
        text or too long. Commands call it once the job's size is checked and before any
        model runs: a bad column found after the work would waste it."""
        if "ids" in self._file:
            with _reading(self.path, "ids"):
                read_ids(self.path, self._file["ids"], keep=False)
        if self.has_labels and num_classes is not None:
            with _reading(self.path, "y"):
                lo, hi = y_range(self._file["y"])
            if lo < 0 or hi >= num_classes:
                raise InputError(f"{self.path}: 'y' holds {lo}..{hi}, outside the "
                                 f"{num_classes} classes{of} (0..{num_classes - 1})")

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
            return read_ids(self.path, self._file["ids"])

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start, stop) of ``x`` as float32 (uint8 scaled by 1/255)."""
        with _reading(self.path, "x"):
            x = self._file["x"][start:stop]
        return self._as_float(x)

    @property
    def stores_uint8(self) -> bool:
        """Whether ``x`` is stored as uint8 pixels (:meth:`read_stored` then gives them
        unscaled, for a device to scale: a quarter of float32's bytes to copy)."""
        return self._file["x"].dtype == np.uint8

    def read_stored(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start, stop) of ``x`` as stored (uint8 unscaled when :attr:`stores_uint8`;
        otherwise :meth:`read`'s checked float32)."""
        if not self.stores_uint8:
            return self.read(start, stop)
        with _reading(self.path, "x"):
            return self._file["x"][start:stop]

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
        if len(uniq) and (uniq[0] < 0 or uniq[-1] >= len(self)):
            raise IndexError(f"rows {uniq[0]}..{uniq[-1]} are outside 0..{len(self) - 1}")
        with _reading(self.path, "x"):
            x = self._as_float(self._sorted_rows(uniq))
        out = np.empty((len(indices), *x.shape[1:]), dtype=np.float32)
        out[order] = x[inverse]
        return out

    def _sorted_rows(self, rows: np.ndarray) -> np.ndarray:
        """``x`` at sorted unique ``rows``, one slice per storage block that holds some of
        them. (h5py's list indexing takes time in proportion to the dataset's declared
        length: 38 s for 64 rows of a file declaring 10^9, with SIGTERM waiting on it.)"""
        x = self._file["x"]
        if len(rows) == 0:
            return np.empty((0, *x.shape[1:]), dtype=x.dtype)
        row_bytes = max(1, x.dtype.itemsize * int(np.prod(x.shape[1:])))
        block = max(1, min(x.chunks[0] if x.chunks else 1 << 30, (4 << 20) // row_bytes))
        cuts = np.flatnonzero(np.diff(rows // block)) + 1
        parts = []
        for group in np.split(rows, cuts):
            lo, hi = int(group[0]), int(group[-1]) + 1
            parts.append(x[lo:hi][group - lo])
        return np.concatenate(parts)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> H5Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ArraySource:
    """An in-memory dataset with the same reading interface as :class:`H5Dataset`."""

    reads_from_disk = False

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


class RowSubset:
    """Rows ``rows`` (sorted) of another source, with the same reading interface: chunks are
    read with the source's ``take``, so only one chunk is in memory (the streaming refinery's
    party reliability checks read a sample of a large target this way)."""

    def __init__(self, source: Any, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0 or np.any(np.diff(rows) <= 0) or rows[0] < 0 or \
                rows[-1] >= len(source):
            raise ValueError("rows must be non-empty, strictly increasing and inside the source")
        self.source, self.rows = source, rows
        self.reads_from_disk = bool(getattr(source, "reads_from_disk", False))

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.source.sample_shape)

    @property
    def has_labels(self) -> bool:
        return False  # y is never needed where a subset is read

    def labels(self) -> np.ndarray | None:
        return None

    def ids(self) -> np.ndarray | None:
        return None

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self.source.take(self.rows[start:stop])

    def chunks(self, size: int = 4096) -> Iterator[tuple[int, np.ndarray]]:
        for start in range(0, len(self), size):
            yield start, self.read(start, start + size)

    def take(self, indices: np.ndarray) -> np.ndarray:
        return self.source.take(self.rows[np.asarray(indices, dtype=np.int64)])

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


def describe_h5(path: str | os.PathLike) -> dict[str, Any]:
    """Datasets (shape, dtype) and attributes of any HDF5 file, for ``mrtf inspect``: at most
    :data:`MAX_LISTED` of each; links are not followed (``visititems`` walks hard links only)
    and an attribute is read only when it is at most :data:`MAX_ATTR_BYTES`. Names and
    values are as stored: printers pass them through ``printable``."""
    with _open(path) as f:
        datasets: dict[str, Any] = {}
        links: dict[str, str] = {}

        def visit(name: str, obj: Any) -> Any:
            if isinstance(obj, h5py.Dataset):
                datasets[name] = {"shape": list(obj.shape), "dtype": str(obj.dtype)}
            return True if len(datasets) >= MAX_LISTED else None  # True stops the walk

        def visit_link(name: str, link: Any) -> Any:
            if isinstance(link, h5py.SoftLink):
                links[name] = f"soft link to {link.path}"
            elif isinstance(link, h5py.ExternalLink):
                links[name] = f"external link to {link.filename}:{link.path}"
            return True if len(links) >= MAX_LISTED else None

        with _reading(Path(path), "the file's index"):
            f.visititems(visit)
            f.visititems_links(visit_link)  # lists links, follows none
            attrs = {name: _attr(f, name) for name in list(f.attrs)[:MAX_LISTED]}
    return {"path": str(path), "datasets": datasets, "links": links, "attrs": attrs}


#: what ``mrtf inspect FILE.h5`` lists of a file at most: datasets, attributes
MAX_LISTED = 1000
MAX_ATTR_BYTES = 1 << 20


def _attr(f: h5py.File, name: str) -> Any:
    """An attribute's value, or a description of it when it is large or unreadable."""
    try:
        size = f.attrs.get_id(name).get_storage_size()
        if size > MAX_ATTR_BYTES:
            return f"<{size:,} bytes, not shown>"
        value = f.attrs[name]
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:
        return f"<unreadable: {first_line(exc, 80)}>"
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value.item() if hasattr(value, "item") and getattr(value, "size", 0) == 1 else \
        value.tolist() if hasattr(value, "tolist") else value
