"""mrtf.compute.lean_ops: the same values as the operations they stand in for."""

import numpy as np
import torch

from mrtf.compute import lean_ops


def test_one_hot_equals_torchs():
    index = torch.from_numpy(np.random.default_rng(7).integers(0, 6, (4, 9)))
    got = lean_ops.one_hot(index, 6)
    assert got.dtype == torch.bool
    assert torch.equal(got.long(), torch.nn.functional.one_hot(index, 6))


def test_row_norms_off_the_cpu_are_the_summed_squares_root(monkeypatch):
    """Off the CPU the norms are sqrt(Σ x²) (no vector-norm kernel): within float rounding
    of Tensor.norm; shown on CPU tensors by taking that branch."""
    x = torch.from_numpy(np.random.default_rng(6).standard_normal((50, 12)).astype(np.float32))
    want = x.norm(dim=1, keepdim=True)

    class Elsewhere(torch.Tensor):  # a CPU tensor whose device reads as CUDA
        @property
        def device(self):
            return torch.device("cuda")

    got = lean_ops.row_norms(x.as_subclass(Elsewhere)).as_subclass(torch.Tensor)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
