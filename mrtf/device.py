"""Device choice: CUDA when present, else CPU."""

from __future__ import annotations

import torch


def pick_device(device: str | None = None) -> torch.device:
    """Return ``torch.device(device)``, or CUDA when available and ``device`` is None/"auto"."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def seed_everything(seed: int) -> torch.Generator:
    """Seed torch's global RNG and return a CPU generator for explicit sampling."""
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)
