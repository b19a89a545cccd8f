"""Reading the target set ahead of the teachers: chunks on the host (pinned for CUDA),
produced by a reader thread while the teachers run on the previous chunk."""

from __future__ import annotations

import queue
import threading

import numpy as np
import torch


def host_chunks(source, batch_size: int, dev: torch.device):
    """``(start, tensor)`` chunks of ``source`` on the host. For CUDA they are copied into
    page-locked memory here, in the reader thread of :func:`prefetched`, so the host-to-device
    copy can run asynchronously (``non_blocking``) instead of through a staging buffer."""
    for start, chunk in source.chunks(batch_size):
        x = torch.from_numpy(np.ascontiguousarray(chunk))
        yield start, (x.pin_memory() if dev.type == "cuda" else x)


def prefetched(chunks, depth: int = 2):
    """The items of ``chunks``, produced by a reader thread up to ``depth`` ahead: HDF5 reads
    and the uint8 → float32 scaling overlap the teachers' forward (torch releases the GIL).
    The reader's exception is raised here, in order."""
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
            for item in chunks:
                if not put(item):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            put(exc)
            return
        put(done)

    worker = threading.Thread(target=read, daemon=True)
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
