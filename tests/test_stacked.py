"""stacked.py (all LeNet teachers in one GEMM + grouped conv) against the plain loop."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from mrtf.io.hdf5 import ArraySource
from mrtf.models import build_model
from mrtf.refinery.native import library
from mrtf.refinery.stacked import _onednn_available, _pooled_unfold, eligible, stacked_forward
from mrtf.refinery.teachers import teacher_logits


def _lenets(k: int, seed: int = 0, **kw) -> list[nn.Module]:
    torch.manual_seed(seed)
    models = [build_model("lenet", 10, **kw).eval() for _ in range(k)]
    with torch.no_grad():  # the zoo's init zeroes conv biases: give them some, to test them
        for m in models:
            for i in (0, 3):
                m.body[i].bias.normal_(0, 0.1)
    return models


NATIVE = pytest.param("native", marks=pytest.mark.skipif(
    library() is None, reason="no C compiler or no AVX-512: the kernel is not built here"))
ENGINES = [NATIVE, "onednn", "gemm"]


def _check(models, x, **kw) -> None:
    run = stacked_forward(models, x[:4], **kw)
    assert run is not None
    with torch.inference_mode():
        got = run(x)
        want = torch.stack([m(x) for m in models])
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-4
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("k,n", [(1, 1), (1, 33), (3, 77), (7, 50)])
def test_random_lenets_28px(k, n, engine):
    torch.manual_seed(k)
    _check(_lenets(k, k), torch.rand(n, 1, 28, 28), engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_blocks_and_micro_batches_not_dividing(engine):
    torch.manual_seed(1)
    x = torch.rand(23, 1, 28, 28)
    _check(_lenets(7, 3), x, block=3, rows1=2, rows2=5, engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_odd_conv_map_and_channels(engine):
    # 29 px: conv1 map 25×25, the max-pool drops its last row/column; 3 input channels
    torch.manual_seed(2)
    _check(_lenets(3, 4, in_channels=3, image_size=29), torch.rand(9, 3, 29, 29), engine=engine)


@pytest.mark.skipif(not _onednn_available(), reason="this torch build lacks the oneDNN ops")
def test_fifty_teachers_onednn_default_blocks(monkeypatch):
    # the shape the bench times: K = 50 (two blocks of 25), 28 px, micro-batches of 8 images
    # that do not divide the 37 images; logits vs the plain loop, and the default engine
    torch.manual_seed(5)
    models, x = _lenets(50, 5), torch.rand(37, 1, 28, 28)
    _check(models, x, engine="onednn")
    default = stacked_forward(models, x[:4]).__qualname__
    assert default.startswith("_native_run" if library() is not None else "_onednn_run")
    import mrtf.refinery.stacked as stacked

    monkeypatch.setattr(stacked, "native_features", lambda models: None)  # no kernel here
    assert stacked_forward(models, x[:4]).__qualname__.startswith("_onednn_run")


def test_pooled_unfold_layout():
    x = torch.arange(2 * 1 * 7 * 7, dtype=torch.float32).reshape(2, 1, 7, 7)
    u = _pooled_unfold(x, 3)  # conv map 5×5 → pooled 2×2
    assert u.shape == (2, 4, 4, 9)
    # sample 1, offset (1, 0), pooled (1, 1) → conv position (3, 2): patch x[1, 0, 3:6, 2:5]
    assert torch.equal(u[1, 2, 3], x[1, 0, 3:6, 2:5].flatten())


@pytest.fixture(scope="module")
def trained():
    """Three LeNets, 60 Adam steps each on half of the 8×8 digits (padding 2 in both convs)."""
    d = load_digits()
    x = torch.from_numpy((d.images[:, None] / 16.0).astype(np.float32))
    y = torch.from_numpy(d.target.astype(np.int64))
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        m = build_model("lenet", 10, in_channels=1, image_size=8)
        opt = torch.optim.Adam(m.parameters(), 3e-3)
        idx = torch.from_numpy(np.random.default_rng(seed).permutation(len(x))[:900])
        for step in range(60):
            b = idx[(step * 64) % 836:(step * 64) % 836 + 64]
            opt.zero_grad()
            nn.functional.cross_entropy(m(x[b]), y[b]).backward()
            opt.step()
        models.append(m.eval())
    return models, x, y


def test_trained_lenets_on_digits(trained):
    models, x, y = trained
    for engine in ["native"] * (library() is not None) + ["onednn", "gemm"]:  # 8 px, padding 2
        _check(models, x[:301], engine=engine)
    with torch.inference_mode():
        assert (models[0](x).argmax(-1) == y).float().mean() > 0.5  # trained-ish


def test_teacher_logits_routes_lenet_groups(trained, monkeypatch):
    import mrtf.refinery.teachers as teachers

    monkeypatch.setattr(teachers, "STACKED_MIN", 2)  # the default; pinned for this test
    models, x, _ = trained
    src = ArraySource(x[:130].numpy())
    fast = teacher_logits(models + [build_model("mlp", 10, in_channels=1, image_size=8)],
                          src, 64, "cpu", stack="fast")
    loop = teacher_logits(models, src, 64, "cpu", stack="loop")
    assert fast.fast_groups == 2
    calls = []
    spy = lambda group, probe: calls.append(len(group)) or stacked_forward(group, probe)  # noqa: E731
    monkeypatch.setattr(teachers, "stacked_forward", spy)
    teacher_logits(models, src, 64, "cpu", stack="fast")
    assert calls == [3]  # the LeNet group went through stacked.py
    np.testing.assert_allclose(fast.logits[:3], loop.logits, rtol=0, atol=1e-4)
    np.testing.assert_array_equal(fast.logits[:3].argmax(-1), loop.logits.argmax(-1))


def test_not_eligible():
    torch.manual_seed(0)
    assert not eligible([])
    assert not eligible([build_model("convnet", 10)])
    mixed = [build_model("lenet", 10), build_model("lenet", 5)]
    assert not eligible(mixed)
    assert stacked_forward(mixed, torch.rand(2, 1, 28, 28)) is None
    assert stacked_forward(_lenets(2), torch.rand(2, 784)) is None  # not an image batch
    with pytest.raises(ValueError, match="engine"):
        stacked_forward(_lenets(2), torch.rand(2, 1, 28, 28), engine="cuda")


@pytest.mark.skipif(library() is None, reason="no C compiler or no AVX-512: no kernel here")
def test_native_slices_a_big_batch(monkeypatch):
    import mrtf.refinery.stacked as stacked

    monkeypatch.setattr(stacked, "NATIVE_BUDGET", 1)  # 64 images per slice: 150 → 3 slices
    torch.manual_seed(6)
    _check(_lenets(3, 6), torch.rand(150, 1, 28, 28), engine="native")
