"""The exact CPU fast path (fastpath.py) against the plain loop, on real digits images."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from mrtf.io.hdf5 import ArraySource
from mrtf.models import build_model
from mrtf.refinery import teachers as teachers_mod
from mrtf.refinery.fastpath import fast_forward, micro_batch, pool_before_relu
from mrtf.refinery.teachers import TeacherChunks, resolve_stack, teacher_logits

KW = {"in_channels": 1, "image_size": 8}


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return (d.images[:, None] / 16.0).astype(np.float32), d.target.astype(np.int64)


def _trained(arch: str, x: np.ndarray, y: np.ndarray, seed: int, **kw) -> nn.Module:
    """A trained-ish teacher: 40 Adam steps on a seed-dependent half of the digits."""
    torch.manual_seed(seed)
    model = build_model(arch, 10, **KW, **kw)
    idx = np.random.default_rng(seed).permutation(len(x))[: len(x) // 2]
    xt, yt = torch.from_numpy(x[idx]), torch.from_numpy(y[idx])
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    for step in range(40):
        b = slice((step * 64) % (len(xt) - 64), (step * 64) % (len(xt) - 64) + 64)
        opt.zero_grad()
        nn.functional.cross_entropy(model(xt[b]), yt[b]).backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def teachers(digits):
    torch.set_num_threads(1)
    x, y = digits
    return ([_trained("lenet", x, y, s) for s in range(3)]
            + [_trained("convnet", x, y, 7), _trained("mlp", x, y, 8)])


def _check_exact(fast: np.ndarray, loop: np.ndarray) -> None:
    scale = float(np.abs(loop).max())
    np.testing.assert_allclose(fast, loop, rtol=0, atol=1e-4 * scale)
    np.testing.assert_array_equal(fast.argmax(-1), loop.argmax(-1))


def test_fast_equals_loop_on_digits(digits, teachers):
    src = ArraySource(digits[0])
    loop = teacher_logits(teachers, src, 500, "cpu", stack="loop")
    fast = teacher_logits(teachers, src, 500, "cpu", stack="fast")
    assert (fast.fast_groups, fast.looped_groups, fast.stacked_groups) == (3, 0, 0)
    _check_exact(fast.logits, loop.logits)
    assert (loop.logits.argmax(-1) == digits[1]).mean(-1).min() > 0.5  # trained-ish


def test_auto_on_cpu_is_fast_and_features_agree(digits, teachers):
    src = ArraySource(digits[0][:300])
    assert resolve_stack("auto", torch.device("cpu")) == "fast"
    # on CUDA grouped.py (LeNet groups as one grouped network, other groups looped); the CPU
    # fast paths are never taken there
    assert resolve_stack("auto", torch.device("cuda")) == "grouped"
    assert resolve_stack("fast", torch.device("cuda")) == "grouped"
    assert resolve_stack(True, torch.device("cuda")) == "vmap"
    auto = teacher_logits(teachers[:3], src, 128, "cpu", features_of=teachers[0])
    loop = teacher_logits(teachers[:3], src, 128, "cpu", features_of=teachers[0], stack="loop")
    assert auto.fast_groups == 1
    _check_exact(auto.logits, loop.logits)
    # θ_{t+1}'s features come from its fast copy, with its logits (fastpath.fast_features):
    # channels-last convolutions round differently, as for the logits
    scale = float(np.abs(loop.features).max())
    np.testing.assert_allclose(auto.features, loop.features, rtol=0, atol=1e-5 * scale)
    plain = teacher_logits(teachers[:3], src, 128, "cpu", stack="fast").logits
    # θ_{t+1}'s fused logits come from its per-teacher fast copy, the group's from stacked.py:
    # the same up to summation order
    _check_exact(auto.logits, plain)


def test_pool_before_relu_is_bit_exact(teachers, digits):
    x = torch.from_numpy(digits[0][:64])
    swapped = pool_before_relu(teachers[0])
    kinds = [type(m).__name__ for m in swapped.body]
    assert kinds[:3] == ["Conv2d", "Pool2x2", "ReLU"]
    with torch.inference_mode():
        assert torch.equal(swapped(x), teachers[0](x))


def test_micro_batch_sized_by_activation():
    lenet28 = build_model("lenet", 10)
    assert micro_batch(lenet28, torch.zeros(1, 1, 28, 28)) == 64  # 36 KiB per sample
    assert micro_batch(build_model("mlp", 10, **KW), torch.zeros(1, 1, 8, 8)) is None


def test_other_architectures_fall_back(digits):
    torch.manual_seed(0)
    vgg = [build_model("vgg8", 10, **KW).eval() for _ in range(2)]
    src = ArraySource(digits[0][:40])
    out = teacher_logits(vgg, src, 40, "cpu", stack="fast")
    assert out.fast_groups == 0 and out.looped_groups == 1
    assert fast_forward(vgg, torch.from_numpy(digits[0][:4])) is None


def test_bf16_agreement(digits, teachers):
    src = ArraySource(digits[0])
    fp32 = teacher_logits(teachers[:3], src, 500, "cpu", stack="fast").logits
    bf16 = teacher_logits(teachers[:3], src, 500, "cpu", stack="fast", precision="bf16").logits
    agree = (bf16.argmax(-1) == fp32.argmax(-1)).mean()
    assert agree > 0.97, agree
    with pytest.raises(ValueError):
        teacher_logits(teachers[:1], src, 500, "cpu", precision="fp8")


@pytest.mark.parametrize("hw", [(24, 24), (13, 9)])
def test_pool2x2_bit_exact(hw):
    from mrtf.refinery.fastpath import Pool2x2

    x = torch.randn(3, 5, *hw)
    want = nn.functional.max_pool2d(x, 2)
    assert torch.equal(Pool2x2()(x), want)  # NCHW: falls back
    got = Pool2x2()(x.contiguous(memory_format=torch.channels_last))
    assert torch.equal(got, want) and got.is_contiguous(memory_format=torch.channels_last)


def test_each_pass_releases_its_pinned_chunks(digits, teachers, monkeypatch):
    """TeacherChunks hands the host cache back when a pass ends, and when it is left early
    (the pinned chunks would otherwise stay resident for the rest of a refine on CUDA)."""
    x, _ = digits
    seen = []
    monkeypatch.setattr(teachers_mod, "release_pinned", seen.append)
    chunks = TeacherChunks(teachers[:2], ArraySource(x[:300]), batch_size=100,
                           device="cpu")
    assert len(list(chunks)) == 3 and seen == [torch.device("cpu")]
    for _ in chunks:
        break
    assert seen == [torch.device("cpu")] * 2
