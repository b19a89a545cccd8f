"""calibration.Signals' tallies over the local models' logits on a torch device (issue 36):
the same loop as calibration._tallies, in torch, float64 softmax, on the refine's device.

The votes are added model by model in float32 as numpy adds them (the same numbers); the
mean softmax and the summed max differ from numpy's only in the last bits of ``exp`` and in
the order of the sums (tests/trust/test_signals_torch.py). The (M, C) votes and mean stay on
the device until the end: 1M rows × 10 classes is 80 MB there.
"""

from __future__ import annotations

import numpy as np
import torch

from mrtf.compute.lean_ops import one_hot
from mrtf.compute.softmax_rows import on_device, softmax64


def tallies_torch(local_logits, k: int, block: int, device: torch.device
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """calibration._tallies on ``device``: votes (M, C), mean softmax (M, C) float32, summed
    max softmax (k,), agreeing-label counts (k, k) of the pairs i < j; numpy on the host."""
    m, c = local_logits.shape[1], local_logits.shape[2]
    votes = torch.zeros((m, c), dtype=torch.float32, device=device)
    mean = torch.zeros((m, c), dtype=torch.float32, device=device)
    conf_sum = torch.zeros(k, dtype=torch.float64, device=device)
    same = torch.zeros((k, k), dtype=torch.float64, device=device)
    for s in range(0, m, block):
        p = softmax64(on_device(local_logits[:k, s:s + block], device))  # (k, n, C)
        n = p.shape[1]
        picks = p.argmax(2)
        acc = torch.zeros((n, c), dtype=torch.float64, device=device)
        for i in range(k):
            # one-hot rows added with weight 1/k: numpy's votes[rows, pick] += 1/k to the
            # bit (v + 1·w at the pick, v + 0·w elsewhere), without indexing kernels
            # (compute/lean_ops.py)
            votes[s:s + n].add_(one_hot(picks[i], c).to(torch.float32), alpha=1.0 / k)
            acc += p[i] / k
        conf_sum += p.amax(2).sum(1)
        mean[s:s + n] = acc
        for i in range(k):
            for j in range(i + 1, k):
                same[i, j] += (picks[i] == picks[j]).sum()
    return (votes.cpu().numpy(), mean.cpu().numpy(), conf_sum.cpu().numpy(),
            same.cpu().numpy())
