"""A caller's modules are lent to a pass, not taken: moved to the compute device and to eval
mode for it, and put back where they were (device and every submodule's train/eval flag)
afterwards, also when the pass fails or its consumer stops early.

Issue 36: on CUDA, ``predict_with_vote`` left the caller's model on the GPU, and the caller's
next CPU forward failed (``Input type (torch.FloatTensor) and weight type
(torch.cuda.FloatTensor)``); ``shot_adapt`` had the same side effect before.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn


def home_device(module: nn.Module) -> torch.device | None:
    """The device of the module's first parameter (or buffer); None when it holds no tensor."""
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return None


@contextmanager
def lent(modules: Sequence[nn.Module | None], device: torch.device) -> Iterator[None]:
    """Within the block every module (None entries skipped; one module may appear twice) is on
    ``device`` in eval mode; on exit each is back on its own device with its own modes."""
    unique = list({id(m): m for m in modules if m is not None}.values())
    homes = [(m, home_device(m), [(s, s.training) for s in m.modules()]) for m in unique]
    for m in unique:
        m.to(device).eval()
    try:
        yield
    finally:
        for m, dev, modes in homes:
            if dev is not None:
                m.to(dev)
            for sub, training in modes:
                sub.training = training


@contextmanager
def kept_home(module: nn.Module) -> Iterator[None]:
    """Whatever the block does with ``module`` (train it on the device), it ends on the device
    it started on, also when the block raises. Its train/eval mode is the block's to set."""
    home = home_device(module)
    try:
        yield
    finally:
        if home is not None:
            module.to(home)
