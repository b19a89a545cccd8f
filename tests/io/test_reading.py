"""mrtf/io/reading.py: the centred zoom, the foreground contrast, and a source read through
them."""

from __future__ import annotations

import numpy as np
import pytest

from mrtf.io.hdf5 import ArraySource, H5Dataset, write_dataset
from mrtf.io.reading import Reading, ReadSource, foreground, is_image_shape, rescale


def _square(side: int = 28, half: int = 6, background: float = 0.2) -> np.ndarray:
    """One (1, 1, side, side) image: a bright centred square on a flat background."""
    x = np.full((1, 1, side, side), background, dtype=np.float32)
    c = side // 2
    x[..., c - half:c + half, c - half:c + half] = 1.0
    return x


def _bright_width(x: np.ndarray) -> int:
    return int((x[0, 0, x.shape[2] // 2] > 0.6).sum())


def test_scale_one_is_the_identity():
    x = np.random.default_rng(0).random((3, 2, 10, 12), dtype=np.float32)
    assert rescale(x, 1.0) is x


def test_shrinking_keeps_the_centre_and_fills_with_the_background():
    x = _square()
    out = rescale(x, 0.5)
    assert out.shape == x.shape and out.dtype == np.float32
    assert _bright_width(out) == pytest.approx(_bright_width(x) / 2, abs=1)
    # the uncovered border is the image's own background, not zero
    np.testing.assert_allclose(out[0, 0, :5], 0.2, atol=1e-6)
    np.testing.assert_allclose(out[0, 0, :, -5:], 0.2, atol=1e-6)


def test_enlarging_grows_the_centre():
    x = _square(half=4)
    assert _bright_width(rescale(x, 1.5)) == pytest.approx(_bright_width(x) * 1.5, abs=1)


def test_each_image_and_channel_gets_its_own_background():
    x = np.concatenate([_square(background=0.0), _square(background=0.5)])
    x = np.concatenate([x, 1 - x], axis=1)  # a second channel with the opposite background
    out = rescale(x, 0.6)
    corners = out[:, :, 0, 0]
    np.testing.assert_allclose(corners, [[0.0, 1.0], [0.5, 0.5]], atol=1e-6)


def test_image_shapes():
    assert is_image_shape((1, 28, 28)) and is_image_shape((3, 32, 32))
    assert not is_image_shape((784,)) and not is_image_shape((1, 4, 4))


def test_foreground_turns_any_figure_on_any_background_bright_on_black():
    rng = np.random.default_rng(2)
    bright = _square(background=0.0)  # MNIST's convention: unchanged (its maximum is 1)
    np.testing.assert_allclose(foreground(bright), bright, atol=1e-6)
    dark = 1.0 - bright  # dark strokes on white
    np.testing.assert_allclose(foreground(dark), bright, atol=1e-6)
    # a colour figure over a coloured, noisy background: the figure is where it is brightest
    colour = np.empty((1, 3, 28, 28), np.float32)
    colour[:] = np.array([0.2, 0.5, 0.7], np.float32)[None, :, None, None]
    colour += rng.normal(0, 0.02, colour.shape).astype(np.float32)
    colour[..., 8:20, 8:20] = np.array([0.9, 0.1, 0.2], np.float32)[None, :, None, None]
    out = foreground(colour)
    assert out.shape == colour.shape and np.allclose(out[:, 0], out[:, 2])
    assert out[0, 0, 8:20, 8:20].min() > 0.9 and np.median(out[0, 0, :6]) < 0.15
    assert foreground(np.full((1, 1, 9, 9), 0.3, np.float32)).max() == 0.0  # flat: black


@pytest.mark.parametrize("spec,want", [("0.7", Reading(0.7)), ("fg", Reading(1.0, True)),
                                       ("fg:0.8", Reading(0.8, True)), ("1", Reading()),
                                       (" FG:0.6 ", Reading(0.6, True))])
def test_reading_specs_round_trip(spec, want):
    assert Reading.parse(spec) == want
    assert Reading.parse(want.spec()) == want


@pytest.mark.parametrize("spec", ["", "fg:", "0.1", "3", "fg:x", "big", "fg:0.7:1", "0.7:fg"])
def test_bad_reading_specs_are_refused(spec):
    with pytest.raises(ValueError, match="a reading is|scale must be in"):
        Reading.parse(spec)


def test_a_reading_applies_the_foreground_then_the_zoom():
    x = 1.0 - _square(background=0.0)
    np.testing.assert_allclose(Reading(0.6, True).apply(x), rescale(foreground(x), 0.6))
    assert Reading().as_given and Reading().apply(x) is x
    assert Reading(0.7, True).describe() == \
        "as each pixel's contrast to the image's dominant colour and at 0.7× its size"


def test_a_read_source_reads_every_way_alike(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.random((37, 1, 16, 16), dtype=np.float32)
    y, ids = rng.integers(0, 3, 37), np.array([f"s{i}" for i in range(37)])
    write_dataset(tmp_path / "t.h5", x, y, ids=ids)
    reading = Reading(0.8, True)
    want = reading.apply(x)
    with H5Dataset(tmp_path / "t.h5") as h5:
        src = ReadSource(h5, reading)
        assert len(src) == 37 and src.sample_shape == (1, 16, 16) and src.reads_from_disk
        np.testing.assert_array_equal(src.labels(), y)
        assert list(src.ids()) == list(h5.ids())
        np.testing.assert_allclose(src.read(5, 20), want[5:20], atol=1e-6)
        np.testing.assert_allclose(np.concatenate([c for _, c in src.chunks(10)]), want,
                                   atol=1e-6)
        np.testing.assert_allclose(src.take(np.array([30, 2, 2])), want[[30, 2, 2]],
                                   atol=1e-6)


def test_a_read_source_refuses_vectors_and_wild_factors():
    with pytest.raises(ValueError, match="not images"):
        ReadSource(ArraySource(np.zeros((4, 20), np.float32)), Reading(0.8))
    with pytest.raises(ValueError, match="scale must be in"):
        Reading(5.0)
