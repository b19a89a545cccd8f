"""mrtf.compute.backend: which implementation runs where."""

import pytest
import torch

from mrtf.compute import backend as bk


def test_the_cpu_keeps_its_path():
    assert bk.choose_backend("cpu") == bk.Backend("faiss-cpu", torch.device("cpu"))
    assert bk.choose_backend("cpu", "torch") == bk.Backend("torch", torch.device("cpu"))
    assert bk.gpu_backend(False).on_host
    if not torch.cuda.is_available():
        assert bk.choose_backend(None).on_host and bk.gpu_backend(True).on_host


def test_cuda_takes_faiss_gpu_else_torch(monkeypatch):
    """On CUDA (pick_device stubbed: no CUDA here): faiss-gpu when it is installed, else
    the torch implementations on the device; faiss-cpu still runs on the host."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(bk, "pick_device", lambda device=None: cuda)
    monkeypatch.setattr(bk, "faiss_gpu_available", lambda: False)
    assert bk.choose_backend(None) == bk.Backend("torch", cuda)
    assert bk.gpu_backend(True) == bk.Backend("torch", cuda)
    assert bk.choose_backend("cuda", "faiss-cpu").device == torch.device("cpu")
    with pytest.raises(ValueError, match="faiss-gpu"):
        bk.choose_backend("cuda", "faiss-gpu")
    monkeypatch.setattr(bk, "faiss_gpu_available", lambda: True)
    assert bk.choose_backend(None) == bk.Backend("faiss-gpu", cuda)


def test_unknown_backend():
    with pytest.raises(ValueError, match="backend must be one of"):
        bk.choose_backend("cpu", "annoy")
