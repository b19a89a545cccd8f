"""The teachers' pass in bfloat16 (``RefineConfig.precision = "bf16"``, ``mrtf refine
--precision bf16``): a group's forward under autocast, and the argmax agreement with fp32 that
the run reports.

Only the teachers' logits change: the party checks, θ_{t+1}'s features, the distillation and
the final labels stay fp32. On the CPU a fast-path group makes its own bfloat16 copies
(fastpath.py); every other group (the grouped LeNets and the loop on CUDA, the loop on the
CPU) runs under ``torch.autocast``. The agreement is measured on the first chunk of the
target, against the same groups in fp32 (docs/gpu.md has the measured speed and agreement).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


def in_bf16(forward: Callable[[torch.Tensor], torch.Tensor], device_type: str
            ) -> Callable[[torch.Tensor], torch.Tensor]:
    """``forward`` run under bfloat16 autocast on ``device_type``, its logits back in float32."""
    def run(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type, dtype=torch.bfloat16):
            return forward(x).float()
    return run


def argmax_agreement(got: dict[int, np.ndarray], want: dict[int, np.ndarray]) -> float:
    """The fraction of (teacher, sample) pairs whose argmax is the same in ``got`` and
    ``want`` (teacher index → logits (m, C))."""
    same = [float((got[i].argmax(1) == want[i].argmax(1)).mean()) for i in want]
    return float(np.mean(same)) if same else 1.0
