"""Device choice: CUDA when present, else CPU; on CUDA, the same labels for the same seed."""

from __future__ import annotations

import os

import torch


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """Return ``torch.device(device)``, or CUDA when available and ``device`` is None/"auto".

    Choosing CUDA also makes it reproducible (:func:`reproducible_cuda`)."""
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        reproducible_cuda()
    return dev


def off_cpu(device: str | torch.device | None) -> torch.device | None:
    """``device`` as a torch.device when it names one other than the CPU, else None: where a
    caller keeps its numpy path for the CPU and moves the work elsewhere. Unlike
    :func:`pick_device`, None stays None (the CPU): the caller was given no device."""
    if device is None:
        return None
    dev = torch.device(device)
    return None if dev.type == "cpu" else dev


def reproducible_cuda() -> None:
    """Deterministic CUDA kernels and true fp32: mrtf promises identical labels for the same
    seed, and labels that match the CPU's up to fp32 rounding.

    Measured on an H100 (issue 14, ``bench/gpu_check.sh tests``): with PyTorch's defaults, two
    refines with one seed gave probabilities that differed by up to 8e-7 (59-71 % of the
    entries), SHOT and FedFTG/FedKF weights differed between runs, and cuDNN's TF32
    convolutions moved teacher logits by up to 1e-4 × their scale (argmax agreement with the
    CPU 99.98 %) for 1.07-1.10× the speed (``bench/gpu_teachers.py``). So: cuDNN and cuBLAS in
    deterministic mode (cuBLAS reads ``CUBLAS_WORKSPACE_CONFIG`` when it creates its handle:
    set here before the first product unless the user set it), no TF32, and PyTorch's
    deterministic algorithms (``warn_only``: an op without a deterministic CUDA kernel warns
    instead of failing the run). These are process-wide PyTorch settings."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)


def seed_everything(seed: int) -> torch.Generator:
    """Seed torch's global RNG and return a CPU generator for explicit sampling."""
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def release_pinned(device: str | torch.device | None) -> bool:
    """Give the page-locked host blocks that PyTorch's CUDA host allocator keeps for reuse
    back to the system, after a pass that pinned its chunks (teachers.TeacherChunks); blocks
    still in use stay. Kept, those blocks count in the resident set for the rest of the run,
    also while nothing is read (docs/gpu.md, "Host memory"); a later pass pins its own. True
    when a cache was emptied; a no-op on the CPU, or where this PyTorch has no such call."""
    if device is None or torch.device(device).type != "cuda":
        return False
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None) \
        or getattr(torch._C, "_host_emptyCache", None)
    if empty is None:
        return False
    empty()
    return True
