"""stacked.py's GEMM engine follows its models' device (issue 36: on CUDA it failed on a CPU
pooling buffer). Checked on the meta device, where a CPU tensor in the path fails as it did
on CUDA, and by ``.to()`` reaching every stacked tensor."""

import pytest
import torch

from mrtf.models import build_model
from mrtf.refinery.stacked import _Block, _gemm_run, stacked_forward


def _lenets(k, device="cpu"):
    torch.manual_seed(0)
    return [build_model("lenet", 10).eval().to(device) for _ in range(k)]


def test_the_gemm_engine_runs_where_its_models_are():
    run = _gemm_run(_lenets(3, "meta"), block=2, rows1=None, rows2=4)
    with torch.inference_mode():
        out = run(torch.empty(9, 1, 28, 28, device="meta"))
    assert out.device.type == "meta" and out.shape == (3, 9, 10)


def test_to_moves_every_stacked_tensor():
    blk = _Block(_lenets(2))
    tensors = [v for v in vars(blk).values() if isinstance(v, torch.Tensor)]
    assert tensors == []  # every tensor is a registered buffer, none a plain attribute
    moved = blk.to(torch.float64)
    assert {b.dtype for b in moved.buffers()} == {torch.float64}
    assert len(list(moved.buffers())) == 10
    assert all(t.dtype == torch.float64 for t in moved.fw + moved.fb)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_stacked_forward_on_cuda_agrees_with_the_models():
    models = _lenets(4, "cuda")
    x = torch.rand(64, 1, 28, 28, device="cuda")
    run = stacked_forward(models, x[:8])
    assert run is not None
    with torch.inference_mode():
        got, want = run(x), torch.stack([m(x) for m in models])
    assert float((got - want).abs().max()) <= 1e-4 * (float(want.abs().max()) + 1)
