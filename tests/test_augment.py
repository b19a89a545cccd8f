"""The student's input jitter (augment.py) and its use in distillation, on real digits."""

import json
import math

import h5py
import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from mrtf.errors import InputError
from mrtf.io.hdf5 import ArraySource
from mrtf.models import build_model
from mrtf.refinery import RefineConfig
from mrtf.refinery.augment import DEFAULT_JITTER, Jitter, applies, jitter
from mrtf.refinery.distill import distill


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return (d.images[:, None] / 16.0).astype(np.float32)[:200]


def _dot(size: int, row: int, col: int) -> torch.Tensor:
    """One image (1, 1, size, size): a bright 2×2 dot on black centred at (row+0.5, col+0.5)."""
    x = torch.zeros(1, 1, size, size)
    x[0, 0, row:row + 2, col:col + 2] = 1.0
    return x


def _centre(x: torch.Tensor) -> np.ndarray:
    """The brightness-weighted centre (row, col) of each image, in pixels."""
    w = x[:, 0].double()
    rows = torch.arange(w.shape[1], dtype=torch.float64)[None, :, None]
    cols = torch.arange(w.shape[2], dtype=torch.float64)[None, None, :]
    total = w.sum((1, 2))
    return torch.stack([(w * rows).sum((1, 2)) / total, (w * cols).sum((1, 2)) / total], 1).numpy()


def test_no_move_is_the_identity(digits):
    x = torch.from_numpy(digits[:16])
    out = jitter(x, torch.Generator().manual_seed(0), Jitter(shift=0.0, rotate=0.0))
    torch.testing.assert_close(out, x, atol=1e-5, rtol=0)


def test_jitter_keeps_shape_is_seeded_and_moves(digits):
    x = torch.from_numpy(digits[:32])
    a = jitter(x, torch.Generator().manual_seed(1))
    b = jitter(x, torch.Generator().manual_seed(1))
    c = jitter(x, torch.Generator().manual_seed(2))
    assert a.shape == x.shape and a.dtype == x.dtype
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert not torch.equal(a, c) and not torch.equal(a, x)


def test_shift_stays_within_its_bound():
    # a dot at the centre of a 28 px image, shift ≤ 2/28 of the side: it moves ≤ 2 px per axis
    x = _dot(28, 13, 13).repeat(200, 1, 1, 1)
    moved = _centre(jitter(x, torch.Generator().manual_seed(0), Jitter(rotate=0.0)))
    d = np.abs(moved - 13.5)
    assert d.max() <= 2.0 + 1e-3
    assert d.max() > 1.5  # the draws use the whole range, not a sliver of it


def test_rotation_stays_within_its_bound():
    # a dot 8 px right of the centre: a rotation by ≤ 10° moves its angle by ≤ 10°
    x = _dot(28, 13, 21).repeat(200, 1, 1, 1)
    c = _centre(jitter(x, torch.Generator().manual_seed(0), Jitter(shift=0.0, rotate=10.0)))
    angle = np.degrees(np.arctan2(c[:, 0] - 13.5, c[:, 1] - 13.5))
    assert np.abs(angle).max() <= 10.0 + 0.5
    assert np.abs(angle).max() > 8.0
    radius = np.hypot(c[:, 0] - 13.5, c[:, 1] - 13.5)
    np.testing.assert_allclose(radius, 8.0, atol=0.3)  # a rotation, not a shrink


@pytest.mark.parametrize("kw, message", [
    ({"shift": 0.6}, "shift"), ({"shift": -0.1}, "shift"), ({"rotate": -1.0}, "rotation"),
    ({"rotate": math.inf}, "rotation"),
])
def test_bad_jitter_is_refused(kw, message):
    with pytest.raises(InputError, match=message):
        Jitter(**kw)


def test_only_images_are_jittered():
    assert applies((1, 28, 28)) and applies((3, 8, 8))
    assert not applies((64,)) and not applies((1, 1, 28))


def test_config_jitters_for_adaptive_only():
    assert RefineConfig().jitter == DEFAULT_JITTER
    for method in ("fedavg", "feddf", "st", "st+rd", "mrtf"):  # the paper's stay the paper's
        assert RefineConfig(method=method).jitter is None
    assert RefineConfig(augment=False).jitter is None


def _student():
    torch.manual_seed(0)
    return build_model("lenet", 10, in_channels=1, image_size=8)


def test_distill_with_jitter_is_deterministic_and_differs(digits):
    targets = np.full((len(digits), 10), 0.1, dtype=np.float32)
    targets[np.arange(len(digits)), np.arange(len(digits)) % 10] = 1.0
    targets /= targets.sum(1, keepdims=True)
    src = ArraySource(digits)

    def run(augment):
        m = distill(_student(), src, targets, steps=20, batch_size=32, seed=3, augment=augment)
        return torch.cat([p.detach().flatten() for p in m.parameters()])

    plain, a, b = run(None), run(DEFAULT_JITTER), run(DEFAULT_JITTER)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert not torch.equal(plain, a)
    # a zero jitter draws from its own stream: batches and dropout are those of a plain run
    torch.testing.assert_close(run(Jitter(0.0, 0.0)), plain, atol=1e-4, rtol=0)


def test_flat_samples_are_not_jittered():
    # MLP inputs given as flat vectors (64 values each, not 1×8×8 images)
    x = np.random.default_rng(0).normal(size=(64, 64)).astype(np.float32)
    targets = np.full((64, 3), 1 / 3, dtype=np.float32)

    def run(augment):
        torch.manual_seed(0)
        m = build_model("mlp", 3, in_channels=1, image_size=8)
        m = distill(m, ArraySource(x), targets, steps=5, batch_size=16, augment=augment)
        return torch.cat([p.detach().flatten() for p in m.parameters()])

    torch.testing.assert_close(run(DEFAULT_JITTER), run(None), atol=0, rtol=0)


def test_refine_cli_records_and_turns_off_the_jitter(digits_federation, tmp_path):
    from click.testing import CliRunner

    from mrtf.cli.main import cli

    received, target, _ = digits_federation
    configs = {}
    for flag in ("--augment", "--no-augment"):
        out = tmp_path / f"{flag}.h5"
        r = CliRunner().invoke(cli, ["refine", str(received), "--data", str(target),
                                     "--labels", str(out), "--steps", "5", flag])
        assert r.exit_code == 0, r.output
        with h5py.File(out) as f:
            configs[flag] = json.loads(f.attrs["config"])
    assert configs["--augment"]["augment"] is True
    assert configs["--no-augment"]["augment"] is False
