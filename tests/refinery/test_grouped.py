"""grouped.py: K zoo LeNets as one grouped network (the CUDA teacher path) equal the loop."""

import numpy as np
import pytest
import torch

from mrtf.io.hdf5 import ArraySource
from mrtf.models.zoo import ConvNet, LeNet
from mrtf.refinery import grouped as grouped_mod
from mrtf.refinery.grouped import GroupedLeNets, grouped_forward
from mrtf.refinery.teachers import TeacherChunks, teacher_logits

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _lenets(k, size=28, seed=0):
    torch.manual_seed(seed)
    return [LeNet(10, 1, size).eval() for _ in range(k)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("size", [8, 28])
def test_grouped_equals_each_model(device, size):
    models = [m.to(device) for m in _lenets(4, size)]
    x = torch.rand(37, 1, size, size, generator=torch.Generator().manual_seed(1)).to(device)
    with torch.inference_mode():
        got = GroupedLeNets(models)(x)
        want = torch.stack([m(x) for m in models])
    assert got.shape == (4, 37, 10)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))


def test_a_chunk_split_into_slices_gives_the_same_logits(monkeypatch):
    models = _lenets(3)
    x = torch.rand(50, 1, 28, 28, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        whole = GroupedLeNets(models)(x)
        # 3 teachers · 16 maps · 24² · 4 bytes per row: 7 rows per slice
        monkeypatch.setattr(grouped_mod, "CONV_BUDGET", 7 * 3 * 16 * 28 * 28 * 4)
        sliced = GroupedLeNets(models)(x)
    torch.testing.assert_close(sliced, whole)


def test_only_two_or_more_eligible_lenets_of_one_shape_are_grouped():
    probe = torch.rand(4, 1, 28, 28)
    assert grouped_forward(_lenets(1), probe) is None
    assert grouped_forward(_lenets(1) + [LeNet(10, 1, 16).eval()], probe) is None
    torch.manual_seed(0)
    assert grouped_forward([ConvNet(10, 1, 28).eval() for _ in range(2)], probe) is None
    assert grouped_forward(_lenets(2), probe) is not None


def test_a_grouping_that_disagrees_on_the_probe_is_refused(monkeypatch):
    models = _lenets(2)
    real = GroupedLeNets._logits
    monkeypatch.setattr(GroupedLeNets, "_logits", lambda self, x: real(self, x) + 1.0)
    assert grouped_forward(models, torch.rand(4, 1, 28, 28)) is None


def test_teacher_pass_grouped_equals_the_loop_and_leaves_other_groups_looped():
    torch.manual_seed(3)
    models = _lenets(3) + [ConvNet(10, 1, 28).eval()]
    x = np.random.default_rng(0).random((300, 1, 28, 28), dtype=np.float32)
    chunks = TeacherChunks(models, ArraySource(x), 128, "cpu", stack="grouped")
    got = np.concatenate([lg for _, lg, _ in chunks], axis=1)
    assert sorted(chunks.kinds) == ["grouped", "loop"]
    want = teacher_logits(models, ArraySource(x), 128, "cpu", stack="loop").logits
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    np.testing.assert_array_equal(got.argmax(2), want.argmax(2))
