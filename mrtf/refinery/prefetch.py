"""Reading the target set ahead of the teachers: chunks on the host (pinned for CUDA),
produced by a reader thread while the teachers run on the previous chunk."""

from __future__ import annotations

import numpy as np
import torch

from mrtf.io.read_ahead import read_ahead


def host_chunks(source, batch_size: int, dev: torch.device):
    """``(start, tensor)`` chunks of ``source`` on the host. For CUDA they are copied into
    page-locked memory here, in the reader thread of :func:`prefetched`, so the host-to-device
    copy can run asynchronously (``non_blocking``) instead of through a staging buffer."""
    for start, chunk in source.chunks(batch_size):
        x = torch.from_numpy(np.ascontiguousarray(chunk))
        yield start, (x.pin_memory() if dev.type == "cuda" else x)


def prefetched(chunks, depth: int = 2):
    """The items of ``chunks``, produced by one reader thread up to ``depth`` ahead
    (mrtf.io.read_ahead): HDF5 reads and the uint8 → float32 scaling overlap the teachers'
    forward (torch releases the GIL). The reader's exception is raised here, in order."""
    return read_ahead(chunks, depth)
