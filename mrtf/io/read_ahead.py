"""Reading a dataset ahead of the compute that uses it (issue 36): while the caller works on
chunk i (a forward pass, a projection and a product), one reader thread reads chunk i + 1
(HDF5 decompression, uint8 → float32 scaling), so the reads overlap the compute.

Exactly one reader thread per iterator, and the caller reads nothing else of the same source
while it iterates: h5py runs every call under one global lock, so two threads reading one
file gain nothing, and the read order stays the plain loop's (the same rows in the same
chunks: the results are bit for bit those of the plain loop). The thread ends with the
iteration: when it is exhausted, when the caller stops early (``break``, an exception, the
generator closed or collected) or when a read fails (its exception is raised in the caller,
in order); it never outlives the iterator by more than one chunk's read.

:func:`source_chunks` reads ahead only where it can help: a source read from disk
(``reads_from_disk``, an HDF5 file) with more than one chunk, for compute on a device other
than the CPU (CUDA), where the host thread waits on the device while the reader reads. For
compute on the CPU it reads plainly: on the shared 2-core development machine (load ~5.5)
reading ahead made the target neighbourhoods of MNIST's 60,000 images slower from a
gzip-compressed file (median 1.86 / 2.13 s against 1.60 / 1.79 s in two runs) and no faster
from an uncompressed one (1.06 / 1.04 s against 1.00 / 1.06 s; bench/read_ahead.py,
docs/benchmarks/read_ahead.md): the reader and the compute compete for the same cores.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

import numpy as np
import torch

T = TypeVar("T")


def read_ahead(items: Iterable[T], depth: int = 1) -> Iterator[T]:
    """The items of ``items`` in order, produced by one reader thread at most ``depth``
    ahead of the caller (the module docstring says when it stops)."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for item in items:
                if not put(item):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            put(exc)
            return
        put(done)

    worker = threading.Thread(target=read, name="mrtf-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        worker.join()


def plain_chunks(source, size: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, rows [start, start + size))`` over ``source`` (anything with ``len`` and
    ``read(start, stop)``), in order: H5Dataset.chunks for any source."""
    for start in range(0, len(source), size):
        yield start, source.read(start, start + size)


def source_chunks(source, size: int, device: str | torch.device = "cpu"
                  ) -> Iterator[tuple[int, np.ndarray]]:
    """:func:`plain_chunks`, read one chunk ahead (:func:`read_ahead`) when the caller
    computes on ``device`` other than the CPU, ``source`` reads from disk and it holds more
    than one chunk (the module docstring says why)."""
    chunks = plain_chunks(source, size)
    if torch.device(device).type != "cpu" and getattr(source, "reads_from_disk", False) \
            and len(source) > size:
        return read_ahead(chunks, 1)
    return chunks
