"""mrtf.device: the device choice, and CUDA's reproducibility settings (set without a GPU)."""

from __future__ import annotations

import os

import pytest
import torch

from mrtf.device import pick_device, release_pinned, reproducible_cuda


def test_pick_device_cpu_and_torch_device():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device(torch.device("cpu")) == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device(None).type == expected and pick_device("auto").type == expected


@pytest.fixture
def restore_torch_flags(monkeypatch):
    """reproducible_cuda changes process-wide settings: put them back for the other tests."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
     torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) = saved[:4]
    torch.use_deterministic_algorithms(saved[4], warn_only=saved[5])


def test_reproducible_cuda_sets_deterministic_fp32(restore_torch_flags):
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default for convolutions
    reproducible_cuda()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()  # warns, never fails a run


def test_reproducible_cuda_keeps_the_users_workspace_setting(restore_torch_flags, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    reproducible_cuda()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_choosing_the_cpu_changes_no_setting(restore_torch_flags):
    torch.backends.cudnn.allow_tf32 = True
    pick_device("cpu")
    assert torch.backends.cudnn.allow_tf32 and "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_off_cpu_names_only_devices_other_than_the_cpu():
    from mrtf.device import off_cpu

    assert off_cpu(None) is None and off_cpu("cpu") is None
    assert off_cpu(torch.device("cpu")) is None
    assert off_cpu("cuda") == torch.device("cuda")  # named, not checked for presence
    assert off_cpu(torch.device("meta")) == torch.device("meta")


def test_release_pinned_empties_the_host_cache_for_cuda_only(monkeypatch):
    """The pinned blocks go back after a CUDA pass; the CPU (or no device) calls nothing."""
    calls = []
    monkeypatch.setattr(torch.accelerator, "empty_host_cache", lambda: calls.append(1),
                        raising=False)
    assert release_pinned("cpu") is False and release_pinned(None) is False
    assert calls == []
    assert release_pinned("cuda") is True and release_pinned(torch.device("cuda", 0)) is True
    assert calls == [1, 1]


def test_release_pinned_without_the_call_is_a_no_op(monkeypatch):
    monkeypatch.delattr(torch.accelerator, "empty_host_cache", raising=False)
    monkeypatch.delattr(torch._C, "_host_emptyCache", raising=False)
    assert release_pinned("cuda") is False
