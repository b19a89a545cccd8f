"""Scratch arrays on disk for the streaming refinery: written once by rows, read back by
row blocks, removed at the end.

Why plain files with ``pread``/``pwrite`` and not ``np.memmap``: every page of a memmap that
is read stays mapped into the process, and counts toward its resident set (``ru_maxrss``)
until unmapped; a 500 MB logits spill read a few times would show as 500 MB more RSS. Reads
into fresh buffers keep the resident set at one block; the kernel's page cache still serves
repeated passes from memory when there is room.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np


class SpillArray:
    """A row-major (M, *row_shape) array in a file: :meth:`write` row blocks once, then read
    row blocks with ``a[s:e]`` (a new ndarray) or :meth:`take` (sorted rows)."""

    def __init__(self, path: Path, shape: tuple[int, ...], dtype=np.float32) -> None:
        self.path, self.shape, self.dtype = path, tuple(shape), np.dtype(dtype)
        self._row = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.ftruncate(self._fd, self._row * self.shape[0])

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def write(self, start: int, block: np.ndarray) -> None:
        """Rows [start, start + len(block)) ← ``block`` (cast to the array's dtype)."""
        data = memoryview(np.ascontiguousarray(block, dtype=self.dtype)).cast("B")
        offset, done = start * self._row, 0
        while done < len(data):
            done += os.pwrite(self._fd, data[done:], offset + done)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) as a new C-contiguous array."""
        start, stop = max(0, start), min(stop, self.shape[0])
        out = np.empty((max(0, stop - start), *self.shape[1:]), dtype=self.dtype)
        buf = memoryview(out).cast("B")
        offset, done = start * self._row, 0
        while done < len(buf):
            got = os.preadv(self._fd, [buf[done:]], offset + done)
            if got == 0:
                raise OSError(f"{self.path}: scratch file shorter than expected")
            done += got
        return out

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("a SpillArray is read by contiguous row slices")
        start, stop, _ = key.indices(self.shape[0])
        return self.read(start, stop)

    def __setitem__(self, key: slice, block: np.ndarray) -> None:
        """``a[s:e] = block``: :meth:`write` by a row slice, as an ndarray is written."""
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("a SpillArray is written by contiguous row slices")
        start, stop, _ = key.indices(self.shape[0])
        if len(block) != stop - start:
            raise ValueError(f"{len(block)} rows for a slice of {stop - start}")
        self.write(start, block)

    def take(self, rows: np.ndarray, block: int = 65_536) -> np.ndarray:
        """Rows at sorted ``rows``, read block by block (one pass over the file)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), *self.shape[1:]), dtype=self.dtype)
        for s in range(0, self.shape[0], block):
            lo, hi = np.searchsorted(rows, [s, s + block])
            if hi > lo:
                out[lo:hi] = self.read(s, s + block)[rows[lo:hi] - s]
        return out

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


PREFIX = ".mrtf-scratch-"


def _claim(folder: Path) -> int | None:
    """An fd holding ``flock`` on ``folder/lock``, or None when a live run holds it."""
    try:
        fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def remove_stale(where: Path) -> None:
    """Remove scratch folders in ``where`` that no live run holds (a SIGKILLed run's): every
    run holds ``flock`` on its folder's lock file while it works."""
    for old in where.glob(f"{PREFIX}*"):
        if not old.is_dir() or old.is_symlink():
            continue
        fd = _claim(old)
        if fd is not None:
            shutil.rmtree(old, ignore_errors=True)
            os.close(fd)


class Scratch:
    """A hidden scratch folder (``.mrtf-scratch-XXXX``) in ``where`` (default: the system's
    temporary folder), holding :class:`SpillArray` files; removed with everything in it when
    the ``with`` block ends, on error too. It is locked while in use, and the folders of
    killed runs (SIGKILL, power loss) found in ``where`` are removed on the way in."""

    def __init__(self, where: str | os.PathLike | None = None) -> None:
        self.where = where
        self.dir: Path | None = None
        self._lock: int | None = None
        self._arrays: list[SpillArray] = []

    def __enter__(self) -> Scratch:
        where = Path(self.where if self.where is not None else tempfile.gettempdir())
        where.mkdir(parents=True, exist_ok=True)
        remove_stale(where)
        self.dir = Path(tempfile.mkdtemp(prefix=PREFIX, dir=where))
        self._lock = _claim(self.dir)
        return self

    def array(self, name: str, shape: tuple[int, ...], dtype=np.float32) -> SpillArray:
        assert self.dir is not None, "use Scratch as a context manager"
        arr = SpillArray(self.dir / f"{name}.bin", shape, dtype)
        self._arrays.append(arr)
        return arr

    def __exit__(self, *exc: object) -> None:
        for arr in self._arrays:
            arr.close()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


class TeacherMajor:
    """A (M, K, C) :class:`SpillArray` of logits seen as the (K, M, C) array the in-memory
    refinery indexes: ``a[:k, s:e]`` (or ``a[:, s:e]``) reads rows s..e and returns a
    C-contiguous (k, e - s, C) block, laid out as a slice of an in-memory (K, M, C) array
    is, so that numpy reduces it in the same order (bit-identical targets)."""

    def __init__(self, rows: SpillArray) -> None:
        self.rows = rows
        m, k, c = rows.shape
        self.shape = (k, m, c)

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        if not (isinstance(key, tuple) and len(key) == 2 and all(isinstance(s, slice)
                                                                 for s in key)):
            raise TypeError("index as a[teachers, rows] with two slices")
        teachers, rows = key
        start, stop, _ = rows.indices(self.shape[1])
        block = self.rows.read(start, stop)[:, teachers]
        return np.ascontiguousarray(block.transpose(1, 0, 2))
