"""Where the refinery's nearest-neighbour and k-means steps run (issue 36).

- ``faiss-cpu``: on the host, as before (faiss-cpu k-means, numpy / torch-CPU GEMMs): the CPU
  path, whose labels do not change;
- ``faiss-gpu``: faiss's GPU k-means and indexes, when faiss-gpu is installed and CUDA present;
- ``torch``: exact torch implementations on any torch device (mrtf.compute.knn and .kmeans,
  mrtf.refinery.cluster_torch): on CUDA without faiss-gpu (the lent GPU machines' CUDA 13
  image cannot install the CUDA 12 faiss-gpu wheels), and on "cpu" in the tests that hold it
  to faiss-cpu.

``auto`` takes the first that applies: faiss-gpu, then torch on CUDA, else faiss-cpu.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mrtf.device import pick_device

BACKENDS = ("auto", "faiss-cpu", "faiss-gpu", "torch")


@dataclass(frozen=True)
class Backend:
    """name: 'faiss-cpu', 'faiss-gpu' or 'torch'; device: where the torch backend computes
    (CPU for faiss-cpu, the CUDA device for faiss-gpu)."""

    name: str
    device: torch.device

    @property
    def on_host(self) -> bool:
        """The unchanged CPU path."""
        return self.name == "faiss-cpu"


def faiss_gpu_available() -> bool:
    """faiss built with GPU support, and a GPU it can see."""
    import faiss  # faiss is imported where it is used: its import costs ~0.3 s

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def choose_backend(device: str | torch.device | None = None, backend: str = "auto"
                   ) -> Backend:
    """The backend for ``device`` (None / 'auto': CUDA when present, :func:`pick_device`).

    'auto': faiss-gpu on CUDA when installed, else torch on CUDA; faiss-cpu on the CPU.
    'torch' runs on ``device`` (also "cpu"); 'faiss-cpu' always on the CPU; 'faiss-gpu'
    raises ValueError where faiss-gpu or CUDA is missing."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    dev = pick_device(device)
    if backend == "auto":
        if dev.type == "cuda":
            backend = "faiss-gpu" if faiss_gpu_available() else "torch"
        else:
            backend = "faiss-cpu"
    if backend == "faiss-cpu":
        return Backend(backend, torch.device("cpu"))
    if backend == "faiss-gpu" and (dev.type != "cuda" or not faiss_gpu_available()):
        raise ValueError("backend 'faiss-gpu' needs faiss-gpu and a CUDA device")
    return Backend(backend, dev)


def gpu_backend(use_gpu: bool) -> Backend:
    """The refinery's ``use_gpu`` flag (pipeline.py and streaming.py pass
    ``torch.cuda.is_available()``) as a backend: 'auto' on the default device when set, else
    the CPU path."""
    return choose_backend(None) if use_gpu else Backend("faiss-cpu", torch.device("cpu"))
