"""mrtf.data.standard on the real files: shapes, class counts (../shared/data/README.md),
the papers' resizing rules, verification and its cache, and the names in the CLI."""

from __future__ import annotations

import gzip
import os
import shutil

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from mrtf.cli.main import cli
from mrtf.data import is_dataset_name, load_dataset, load_standard, parse_standard_name, registry
from mrtf.data.standard import parse_idx
from mrtf.errors import InputError
from mrtf.federated.run_config import RunConfig

# Class counts from ../shared/data/README.md.
COUNTS = {
    ("mnist", "train"): [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949],
    ("mnist", "test"): [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009],
    ("usps", "train"): [1194, 1005, 731, 658, 652, 556, 664, 645, 542, 644],
    ("usps", "test"): [359, 264, 198, 166, 200, 160, 170, 147, 166, 177],
    ("mnistm", "test"): [878, 1016, 933, 908, 890, 807, 856, 914, 880, 919],
}
SHAPES = {"mnist": (1, 28, 28), "usps": (1, 16, 16), "mnistm": (3, 32, 32)}


@pytest.mark.parametrize("name,split", list(COUNTS))
def test_splits_shapes_and_class_counts(standard, name, split):
    ds = standard(name, split)
    assert ds.name == f"{name}:{split}"
    assert ds.x.shape == (sum(COUNTS[name, split]), *SHAPES[name])
    assert ds.x.dtype == np.float32 and ds.y.dtype == np.int64
    assert ds.x.min() == 0.0 and ds.x.max() == 1.0
    assert np.bincount(ds.y, minlength=10).tolist() == COUNTS[name, split]


def test_mnistm_labels_are_the_first_mnist_test_labels(standard):
    assert np.array_equal(standard("mnistm").y, standard("mnist").y[:9001])


def test_usps_resized_as_shot_does(standard, shared_data):
    native = standard("usps", "test").x
    ds = load_standard("usps", "test", size=28, data_dir=shared_data)
    want = F.interpolate(torch.from_numpy(native), size=(28, 28), mode="bilinear",
                         align_corners=False, antialias=False).clamp(0, 1).numpy()
    assert ds.x.shape == (2007, 1, 28, 28) and np.array_equal(ds.x, want)
    assert np.array_equal(ds.y, standard("usps", "test").y)


def test_mnist_to_mnistm_form_and_luminance(standard, shared_data):
    ds = load_standard("mnist", "test", size=32, channels=3, data_dir=shared_data)
    assert ds.x.shape == (10000, 3, 32, 32)
    assert np.array_equal(ds.x[:, 0], ds.x[:, 1]) and np.array_equal(ds.x[:, 1], ds.x[:, 2])
    grey = load_standard("mnistm", "test", channels=1, data_dir=shared_data).x
    rgb = standard("mnistm").x
    want = 0.299 * rgb[:, 0] + 0.587 * rgb[:, 1] + 0.114 * rgb[:, 2]
    assert grey.shape == (9001, 1, 32, 32) and np.allclose(grey[:, 0], want, atol=1e-6)


def test_names_and_splits():
    assert parse_standard_name("mnist") == ("mnist", "test", "resize")
    assert parse_standard_name("usps:train") == ("usps", "train", "resize")
    assert parse_standard_name("mnist5k") is None and parse_standard_name("x.h5") is None
    with pytest.raises(InputError, match="only its test split"):
        parse_standard_name("mnistm:train")
    with pytest.raises(InputError, match="no split 'val'"):
        load_standard("mnist", "val")
    assert is_dataset_name("mnistm:test") and is_dataset_name("digits")
    assert not is_dataset_name("target.h5")


def test_missing_file_names_the_fetch_command(tmp_path):
    with pytest.raises(InputError, match=r"run `mrtf data fetch usps`"):
        load_standard("usps", data_dir=tmp_path)
    os.environ["MRTF_DATA"] = str(tmp_path / "env")
    try:
        with pytest.raises(InputError, match="env/mnist/t10k-images"):
            load_standard("mnist")
    finally:
        del os.environ["MRTF_DATA"]


def test_recompressed_gz_verifies_and_changed_content_does_not(tmp_path, shared_data):
    """The check is on the IDX content: LeCun's .gz and a re-compression both pass."""
    (tmp_path / "mnist").mkdir()
    raw = gzip.decompress((shared_data / "mnist/t10k-labels-idx1-ubyte.gz").read_bytes())
    shutil.copy(shared_data / "mnist/t10k-images-idx3-ubyte.gz", tmp_path / "mnist")
    labels = tmp_path / "mnist/t10k-labels-idx1-ubyte.gz"
    labels.write_bytes(gzip.compress(raw, compresslevel=1, mtime=0))
    assert np.bincount(load_standard("mnist", data_dir=tmp_path).y)[1] == 1135
    bad = bytearray(raw)
    bad[-1] = (bad[-1] + 1) % 10  # one label changed: still a valid IDX file
    labels.write_bytes(gzip.compress(bytes(bad), mtime=0))
    with pytest.raises(InputError, match="checksum mismatch for mnist/t10k-labels"):
        load_standard("mnist", data_dir=tmp_path)


def test_verification_is_cached_by_size_and_mtime(tmp_path, shared_data, monkeypatch):
    (tmp_path / "usps").mkdir()
    copy = tmp_path / "usps/usps.h5"
    shutil.copy(shared_data / "usps/usps.h5", copy)
    calls = []
    real = registry.usps_arrays_digest
    monkeypatch.setattr(registry, "usps_arrays_digest", lambda p: calls.append(p) or real(p))
    load_standard("usps", data_dir=tmp_path)
    registry._VERIFIED.clear()  # a new process: the cache file under XDG_CACHE_HOME answers
    load_standard("usps", data_dir=tmp_path)
    assert len(calls) == 1
    with h5py.File(copy, "r+") as fh:  # tampered: size and mtime change, so it is re-hashed
        fh["test/target"][0] = (fh["test/target"][0] + 1) % 10
    with pytest.raises(InputError, match="checksum mismatch for usps/usps.h5"):
        load_standard("usps", data_dir=tmp_path)
    assert len(calls) == 2


def test_names_work_in_load_dataset_and_run_config(standard, shared_data, monkeypatch):
    monkeypatch.setenv("MRTF_DATA", str(shared_data))
    ds = load_dataset("usps:train", image_size=28)
    assert ds.x.shape == (7291, 1, 28, 28)
    RunConfig(dataset="mnist:train", target="usps").validate()
    with pytest.raises(InputError, match="no split 'dev'"):
        RunConfig(dataset="mnist:dev").validate()


def test_cli_convert_and_simulate_take_standard_names(shared_data, tmp_path, monkeypatch):
    monkeypatch.setenv("MRTF_DATA", str(shared_data))
    run = CliRunner().invoke
    res = run(cli, ["convert", "usps:test", str(tmp_path / "u.h5"), "--image-size", "28"])
    assert res.exit_code == 0, res.output
    with h5py.File(tmp_path / "u.h5") as fh:
        assert fh["x"].shape == (2007, 1, 28, 28) and fh.attrs["source"] == "usps:test"
    res = run(cli, ["simulate", "--dataset", "usps:test", "--clients", "2", "--ratio", "1",
                    "--local-steps", "2", "--target-size", "100", "--target", "mnist",
                    "--export-target", str(tmp_path / "t.h5")])
    assert res.exit_code == 0, res.output
    with h5py.File(tmp_path / "t.h5") as fh:
        assert fh["x"].shape == (100, 1, 16, 16)
    res = run(cli, ["convert", "mnistm:train", str(tmp_path / "m.h5")])
    assert res.exit_code == 2 and "only its test split" in res.output


def test_idx_headers_are_checked():
    good = (0x803).to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in (2, 28, 28))
    assert parse_idx(good + bytes(2 * 784), 0x803, (28, 28), "f").shape == (2, 28, 28)
    for data, message in [(good[:10], "too short"), (good + bytes(784), "1568"),
                          (good.replace(b"\x08\x03", b"\x08\x01", 1), "magic"),
                          (good[:8] + (10**6).to_bytes(4, "big") + good[12:], "sizes")]:
        with pytest.raises(InputError, match=message):
            parse_idx(data, 0x803, (28, 28), "f")


def test_corrupt_files_are_one_line_errors(tmp_path):
    (tmp_path / "mnist").mkdir()
    (tmp_path / "usps").mkdir()
    good = gzip.compress(bytes(5000))
    (tmp_path / "mnist/t10k-images-idx3-ubyte.gz").write_bytes(good[:20] + b"\xff" * 40)
    with pytest.raises(InputError, match="not a readable gzip file"):
        load_standard("mnist", data_dir=tmp_path)
    (tmp_path / "usps/usps.h5").write_bytes(b"not hdf5" * 100)
    with pytest.raises(InputError, match="not a readable HDF5 file"):
        load_standard("usps", data_dir=tmp_path)
    with h5py.File(tmp_path / "usps/usps.h5", "w") as fh:
        fh["train/data"] = np.array([b"text"] * 3)
    with pytest.raises(InputError, match="not a readable HDF5 file|no usable"):
        load_standard("usps", data_dir=tmp_path)
