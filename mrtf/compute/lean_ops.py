"""Operations written with the kernels a refine loads anyway (issue 36, host memory).

CUDA loads a kernel's module at its first launch and keeps the module's image in host memory
for the rest of the process; PyTorch's indexing, scatter and vector-norm modules were among the
largest a refine on CUDA loaded, for a few calls each (docs/gpu.md, "Host memory"). These
give the same values with comparisons, products and sums, which the refine needs elsewhere.
On the CPU, where no module is loaded, :func:`row_norms` keeps ``Tensor.norm``.
"""

from __future__ import annotations

import torch


def one_hot(index: torch.Tensor, n: int) -> torch.Tensor:
    """``index`` (...,) int → (..., n) bool, True at each index: ``torch.nn.functional.one_hot``
    by a comparison with 0..n-1 (no scatter kernels)."""
    return index[..., None] == torch.arange(n, device=index.device)


def row_norms(x: torch.Tensor) -> torch.Tensor:
    """(n, 1) L2 norms of the rows, in x's dtype. On the CPU ``Tensor.norm``; elsewhere the
    root of the summed squares (no vector-norm kernels)."""
    if x.device.type == "cpu":
        return x.norm(dim=1, keepdim=True)
    return torch.sqrt((x * x).sum(1, keepdim=True))
