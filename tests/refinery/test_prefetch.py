"""prefetch.py: uint8 pixels copied as uint8 for CUDA and scaled there, to numpy's last bit."""

import numpy as np
import pytest
import torch

from mrtf.io.hdf5 import H5Dataset, write_dataset
from mrtf.refinery.prefetch import host_chunks, on_device

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (pinned memory)")


@pytest.mark.parametrize("device", DEVICES)
def test_every_pixel_value_scales_as_numpy_does(device):
    pixels = np.arange(256, dtype=np.uint8)
    got = on_device(torch.from_numpy(pixels), torch.device(device)).cpu().numpy()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, pixels.astype(np.float32) / 255.0)  # bit for bit


def test_float_chunks_pass_through_unchanged():
    x = torch.rand(3, 1, 4, 4)
    assert on_device(x, torch.device("cpu")) is x


@pytest.fixture
def pixels_h5(tmp_path):
    x = np.random.default_rng(0).integers(0, 256, (300, 1, 8, 8), dtype=np.uint8)
    write_dataset(tmp_path / "t.h5", x)
    return tmp_path / "t.h5", x


def test_stored_rows_are_the_raw_pixels_and_floats_are_read(pixels_h5, tmp_path):
    path, x = pixels_h5
    with H5Dataset(path) as ds:
        assert ds.stores_uint8
        np.testing.assert_array_equal(ds.read_stored(10, 20), x[10:20])
    write_dataset(tmp_path / "f.h5", x.astype(np.float32) / 255.0)
    with H5Dataset(tmp_path / "f.h5") as ds:
        assert not ds.stores_uint8
        np.testing.assert_array_equal(ds.read_stored(10, 20), ds.read(10, 20))


def test_cpu_chunks_are_the_float_reads(pixels_h5):
    path, _ = pixels_h5
    with H5Dataset(path) as ds:
        chunks = list(host_chunks(ds, 128, torch.device("cpu")))
        assert [s for s, _ in chunks] == [0, 128, 256]
        np.testing.assert_array_equal(np.concatenate([c.numpy() for _, c in chunks]),
                                      ds.read(0, None))


@CUDA
def test_cuda_chunks_travel_as_uint8_and_arrive_as_the_float_reads(pixels_h5):
    path, _ = pixels_h5
    dev = torch.device("cuda")
    with H5Dataset(path) as ds:
        chunks = list(host_chunks(ds, 128, dev))
        assert all(c.dtype == torch.uint8 and c.is_pinned() for _, c in chunks)
        got = np.concatenate([on_device(c, dev).cpu().numpy() for _, c in chunks])
        np.testing.assert_array_equal(got, ds.read(0, None))
