"""USPS in MNIST's frame (``load_standard(frame="mnist")``, ``usps:SPLIT:framed``) on the real
USPS copy in ../shared/data: where the digits land, what stays as it was, the names."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from mrtf.cli.main import cli
from mrtf.data import StandardName, adapt_images, load_dataset, load_standard, parse_standard_name
from mrtf.errors import InputError


@pytest.fixture(scope="module")
def framed(shared_data):
    return load_standard("usps", "test", frame="mnist", data_dir=shared_data)


def _ink_box(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per image: the rows and the columns holding any ink (N×28 booleans each)."""
    ink = x[:, 0] > 0
    return ink.any(2), ink.any(1)


def test_framed_digits_lie_in_the_central_20x20_box(framed):
    rows, cols = _ink_box(framed.x)
    outside = np.r_[0:4, 24:28]
    assert not rows[:, outside].any() and not cols[:, outside].any()
    # the digits fill the box as they filled 16×16: tall ones span all 20 rows
    assert rows.sum(1).max() == 20 and np.median(rows.sum(1)) >= 18


def test_framed_is_the_16_to_20_resize_in_a_4_pixel_border(standard, framed):
    native = torch.from_numpy(standard("usps", "test").x)
    inner = F.interpolate(native, size=(20, 20), mode="bilinear", align_corners=False,
                          antialias=False).clamp(0, 1)
    assert np.array_equal(framed.x, F.pad(inner, (4, 4, 4, 4)).numpy())


def test_framed_has_the_unframed_form(standard, shared_data, framed):
    resized = load_standard("usps", "test", size=28, data_dir=shared_data)
    assert framed.x.shape == resized.x.shape == (2007, 1, 28, 28)
    assert framed.x.dtype == resized.x.dtype == np.float32
    assert framed.x.min() == 0.0 and 0.99 < framed.x.max() <= 1.0
    assert np.array_equal(framed.y, resized.y) and framed.y.dtype == np.int64
    assert framed.name == "usps:test:framed" and resized.name == "usps:test"
    assert not np.array_equal(framed.x, resized.x)


def test_resize_stays_the_default_and_the_previous_rule(standard, shared_data):
    """frame="resize" is what load_standard did before framing existed (SHOT's 16→28)."""
    native = torch.from_numpy(standard("usps", "test").x)
    before = F.interpolate(native, size=(28, 28), mode="bilinear", align_corners=False,
                           antialias=False).clamp(0, 1).numpy()
    default = load_standard("usps", "test", size=28, data_dir=shared_data).x
    explicit = load_standard("usps", "test", size=28, frame="resize", data_dir=shared_data).x
    assert np.array_equal(default, before) and np.array_equal(explicit, before)


def test_other_sizes_resize_the_framed_28x28_image(shared_data, framed):
    mm = load_standard("usps", "test", size=32, channels=3, frame="mnist", data_dir=shared_data)
    want = adapt_images(framed.x, 32, antialias=False)
    assert mm.x.shape == (2007, 3, 32, 32)
    assert all(np.array_equal(mm.x[:, c], want[:, 0]) for c in range(3))


def test_names_parse_the_frame():
    assert parse_standard_name("usps:train:framed") == StandardName("usps", "train", "mnist")
    assert parse_standard_name("usps:framed") == StandardName("usps", "test", "mnist")
    assert parse_standard_name("usps:train") == StandardName("usps", "train", "resize")
    for bad, message in [("usps:test:big", r"expected NAME\[:SPLIT\]\[:framed\]"),
                         ("usps:framed:test", "expected NAME"),
                         ("usps:test:framed:framed", "expected NAME"),
                         ("mnist:framed", "applies to usps only"),
                         ("mnistm:test:framed", "applies to usps only"),
                         ("usps:val:framed", "no split 'val'")]:
        with pytest.raises(InputError, match=message):
            parse_standard_name(bad)
    with pytest.raises(InputError, match="frame must be one of resize, mnist"):
        load_standard("usps", frame="mnist-like")
    with pytest.raises(InputError, match="applies to usps only"):
        load_standard("mnist", frame="mnist")


def test_load_dataset_takes_the_framed_name(shared_data, framed, monkeypatch):
    monkeypatch.setenv("MRTF_DATA", str(shared_data))
    ds = load_dataset("usps:framed")
    assert ds.name == "usps:test:framed" and np.array_equal(ds.x, framed.x)


def _one_error_line(res) -> str:
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mrtf: error:")
    return lines[0]


def test_cli_takes_framed_names_and_refuses_bad_ones(shared_data, framed, tmp_path,
                                                     monkeypatch):
    monkeypatch.setenv("MRTF_DATA", str(shared_data))
    run = CliRunner().invoke
    res = run(cli, ["convert", "usps:test:framed", str(tmp_path / "u.h5")])
    assert res.exit_code == 0, res.output
    with h5py.File(tmp_path / "u.h5") as fh:
        assert fh.attrs["source"] == "usps:test:framed"
        assert np.array_equal(fh["x"][()], framed.x)
    res = run(cli, ["simulate", "--dataset", "usps:train:framed", "--clients", "2", "--ratio",
                    "1", "--local-steps", "1", "--target-size", "50", "--target", "mnist",
                    "--export-target", str(tmp_path / "t.h5")])
    assert res.exit_code == 0, res.output
    with h5py.File(tmp_path / "t.h5") as fh:
        assert fh["x"].shape == (50, 1, 28, 28)  # MNIST as it is: framed USPS is 28×28
    assert "expected NAME[:SPLIT][:framed]" in _one_error_line(
        run(cli, ["simulate", "--dataset", "usps:test:big", "--out", str(tmp_path / "r")]))
    assert "applies to usps only" in _one_error_line(
        run(cli, ["simulate", "--dataset", "usps:train", "--target", "mnist:test:framed"]))
    assert "applies to usps only" in _one_error_line(
        run(cli, ["convert", "mnistm:framed", str(tmp_path / "m.h5")]))
    assert not (tmp_path / "m.h5").exists()
