"""Checks of an untrusted HDF5 file's structure before its data are used: links, the kind of
storage, and the ``ids`` and ``y`` columns (shape, dtype, range, decodability, size).

Links: ``x``, ``y``, ``ids`` (and a labels file's columns) must be plain datasets of the file
itself. A soft link is refused (HDF5 follows up to 16 of them and a loop ends in a library
error), and so is an external link (it reads another file, like an external or a virtual
dataset: a link to itself loops, a link to a non-HDF5 file fails inside HDF5). ``h5repack``
or ``h5copy`` turns either into a plain dataset.

The column checks are in two steps so that nothing long runs on an unchecked file: the header
(dtype, shape, the width of fixed-length text) when the file is opened, the values (``y``'s
range, every id decodable as UTF-8 and at most :data:`MAX_ID_BYTES`) by :func:`y_range` and
:func:`read_ids` in blocks of :data:`COLUMN_BLOCK` rows, which commands run once the job's
size has been checked and before any model runs.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from mrtf.errors import InputError, printable

#: the longest id, in UTF-8 bytes: ids are file names (a path is at most 4096 bytes on Linux)
MAX_ID_BYTES = 4096
#: rows of ``y`` or ``ids`` read at a time (text ids: at most 4 MB a block)
COLUMN_BLOCK = 1024


def root_dataset(p: Path, f: h5py.File, name: str) -> h5py.Dataset | None:
    """The plain dataset ``name`` at the root of ``f``, or None when there is none; a link
    (soft or external), a group or an external or virtual dataset is refused."""
    try:
        link = f.get(name, getlink=True)
    except (KeyError, OSError, RuntimeError, ValueError) as exc:
        raise InputError(f"{p}: cannot read the entry '{name}' ({exc})") from None
    if link is None:
        return None
    if isinstance(link, h5py.SoftLink):
        raise InputError(f"{p}: '{name}' is a soft link (to {printable(link.path, 80)!r}); "
                         "store it as a plain dataset (h5repack or h5copy)")
    if isinstance(link, h5py.ExternalLink):
        raise InputError(
            f"{p}: '{name}' is an external link (to {printable(link.filename, 80)!r}, "
            f"{printable(link.path, 80)!r}; it reads another file); store it as a plain "
            "dataset (h5repack or h5copy)")
    if not isinstance(link, h5py.HardLink):
        raise InputError(f"{p}: '{name}' is a {type(link).__name__}; store it as a plain "
                         "dataset")
    obj = f[name]
    if not isinstance(obj, h5py.Dataset):
        raise InputError(f"{p}: '{name}' is a group, not a dataset")
    plain_storage(p, name, obj)
    return obj


def plain_storage(p: Path, name: str, ds: h5py.Dataset) -> None:
    """Refuse a virtual or external dataset: it reads other files (any raw file, for external
    storage) and can declare far more rows than its file holds."""
    if ds.is_virtual or ds.external:
        raise InputError(f"{p}: '{name}' is a {'virtual' if ds.is_virtual else 'external'} "
                         "dataset (it reads other files); store it as a plain dataset")


def check_y_header(p: Path, ds: h5py.Dataset, rows: int) -> None:
    """``y``: one integer per sample."""
    if ds.ndim != 1 or ds.dtype.kind not in "iu":
        raise InputError(f"{p}: 'y' must be a 1-d integer array, got {ds.dtype} of shape "
                         f"{ds.shape}")
    if ds.shape[0] != rows:
        raise InputError(f"{p}: 'y' has {ds.shape[0]} rows but 'x' has {rows}")


def check_ids_header(p: Path, ds: h5py.Dataset, rows: int) -> None:
    """``ids``: one integer or one text per sample (fixed-length text at most
    :data:`MAX_ID_BYTES` wide); anything else, e.g. a (200, 10^8) byte matrix, is refused from
    the header alone."""
    if ds.ndim != 1:
        raise InputError(f"{p}: 'ids' must be 1-d (one id per sample), got shape {ds.shape}")
    if ds.shape[0] != rows:
        raise InputError(f"{p}: 'ids' has {ds.shape[0]} rows but 'x' has {rows}")
    if ds.dtype.kind in "iu":
        return
    if h5py.check_string_dtype(ds.dtype) is None:
        raise InputError(f"{p}: 'ids' must hold integers or text (UTF-8 strings), got "
                         f"{ds.dtype}")
    if ds.dtype.kind == "S" and ds.dtype.itemsize > MAX_ID_BYTES:
        raise InputError(f"{p}: 'ids' are {ds.dtype.itemsize:,}-byte strings; an id may be "
                         f"at most {MAX_ID_BYTES} bytes")


def read_ids(p: Path, ds: h5py.Dataset, keep: bool = True) -> np.ndarray | None:
    """An ``ids`` dataset (checked by :func:`check_ids_header`), read in blocks: numbers as
    they are, text as ``str`` (object array). A text id that is not UTF-8 or longer than
    :data:`MAX_ID_BYTES` is refused, naming its row. ``keep=False`` only checks (returns
    None), holding one block at a time."""
    if ds.dtype.kind in "iu":
        return ds[:] if keep else None
    out: list[str] = []
    for start in range(0, ds.shape[0], COLUMN_BLOCK):
        block = ds[start:start + COLUMN_BLOCK]
        for i, raw in enumerate(block.tolist()):
            text = _decoded(p, raw, start + i)
            if keep:
                out.append(text)
    return np.array(out, dtype=object) if keep else None


def _decoded(p: Path, raw: bytes | str, row: int) -> str:
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    if len(data) > MAX_ID_BYTES:
        raise InputError(f"{p}: 'ids' row {row} is {len(data):,} bytes long; an id may be at "
                         f"most {MAX_ID_BYTES} bytes")
    try:
        return data.rstrip(b"\0").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{p}: 'ids' row {row} is not valid UTF-8 text ({exc.reason} at "
                         f"byte {exc.start}: {printable(data[:40])})") from None


def y_range(ds: h5py.Dataset) -> tuple[int, int]:
    """Smallest and largest value of ``y`` (checked by :func:`check_y_header`), read in
    blocks (exact for uint64 values beyond int64)."""
    lo, hi = None, None
    for start in range(0, ds.shape[0], COLUMN_BLOCK * 64):
        block = ds[start:start + COLUMN_BLOCK * 64]
        if block.size:
            b_lo, b_hi = int(block.min()), int(block.max())
            lo = b_lo if lo is None else min(lo, b_lo)
            hi = b_hi if hi is None else max(hi, b_hi)
    return (0, 0) if lo is None else (lo, hi)
