"""Reading the target set ahead of the teachers: chunks on the host (pinned for CUDA),
produced by a reader thread while the teachers run on the previous chunk."""

from __future__ import annotations

import numpy as np
import torch

from mrtf.io.read_ahead import read_ahead


def host_chunks(source, batch_size: int, dev: torch.device):
    """``(start, tensor)`` chunks of ``source`` on the host. For CUDA they are copied into
    page-locked memory here, in the reader thread of :func:`prefetched`, so the host-to-device
    copy can run asynchronously (``non_blocking``) instead of through a staging buffer; and
    uint8 pixels stay uint8 (a quarter of the bytes to convert, pin and copy), scaled on the
    device by :func:`on_device`. Issue 36's first H100 run spent its reader thread on the
    float32 conversion and pinning of every pass over a 1M-row target."""
    cuda = dev.type == "cuda"
    if cuda and getattr(source, "stores_uint8", False):
        for start in range(0, len(source), batch_size):
            raw = source.read_stored(start, start + batch_size)
            yield start, torch.from_numpy(np.ascontiguousarray(raw)).pin_memory()
        return
    for start, chunk in source.chunks(batch_size):
        x = torch.from_numpy(np.ascontiguousarray(chunk))
        yield start, (x.pin_memory() if cuda else x)


def on_device(chunk: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """A :func:`host_chunks` chunk on ``dev`` as float32 inputs: uint8 pixels divided by 255
    there. Divided by a tensor, not a Python number: PyTorch's CUDA kernel multiplies by the
    reciprocal of a scalar divisor, which is not always numpy's ``x / 255`` to the last bit
    (tests/refinery/test_prefetch.py checks all 256 values)."""
    x = chunk.to(dev, non_blocking=True)
    if x.dtype != torch.uint8:
        return x
    return x.float().div_(torch.tensor(255.0, device=dev))


def prefetched(chunks, depth: int = 2):
    """The items of ``chunks``, produced by one reader thread up to ``depth`` ahead
    (mrtf.io.read_ahead): HDF5 reads and the uint8 → float32 scaling overlap the teachers'
    forward (torch releases the GIL). The reader's exception is raised here, in order."""
    return read_ahead(chunks, depth)
