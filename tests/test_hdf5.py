import h5py
import numpy as np
import pytest

from mrtf.errors import InputError
from mrtf.io import H5Dataset, LabelSet, read_labels, write_dataset, write_labels


def test_chunks_take_and_uint8(tmp_path):
    x = np.arange(10 * 4, dtype=np.uint8).reshape(10, 1, 2, 2)
    write_dataset(tmp_path / "d.h5", x, np.arange(10), ids=np.arange(10) + 100)
    with H5Dataset(tmp_path / "d.h5") as ds:
        assert len(ds) == 10 and ds.sample_shape == (1, 2, 2)
        got = np.concatenate([c for _, c in ds.chunks(3)])
        np.testing.assert_allclose(got, x / 255.0, rtol=1e-6)
        np.testing.assert_allclose(ds.take(np.array([7, 2, 7])), x[[7, 2, 7]] / 255.0,
                                   rtol=1e-6)
        assert ds.ids().tolist()[:2] == [100, 101]


def test_bad_files(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        H5Dataset(tmp_path / "none.h5")
    (tmp_path / "junk.h5").write_bytes(b"not hdf5 at all")
    with pytest.raises(InputError, match="not a readable HDF5"):
        H5Dataset(tmp_path / "junk.h5")
    with h5py.File(tmp_path / "nox.h5", "w") as f:
        f["images"] = np.zeros((3, 2))
    with pytest.raises(InputError, match="no dataset 'x'"):
        H5Dataset(tmp_path / "nox.h5")
    with h5py.File(tmp_path / "empty.h5", "w") as f:
        f["x"] = np.zeros((0, 1, 4, 4), np.float32)
    with pytest.raises(InputError, match="empty"):
        H5Dataset(tmp_path / "empty.h5")
    with h5py.File(tmp_path / "rows.h5", "w") as f:
        f["x"] = np.zeros((3, 4), np.float32)
        f["y"] = np.zeros(2, np.int64)
    with pytest.raises(InputError, match="'y' has 2 rows"):
        H5Dataset(tmp_path / "rows.h5")


def test_truncated_h5(tmp_path):
    write_dataset(tmp_path / "d.h5", np.zeros((50, 1, 8, 8), np.float32))
    data = (tmp_path / "d.h5").read_bytes()
    (tmp_path / "t.h5").write_bytes(data[: len(data) // 3])
    with pytest.raises(InputError):
        with H5Dataset(tmp_path / "t.h5") as ds:
            ds.read()


def test_labels_round_trip(tmp_path):
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]], np.float32)
    ls = LabelSet.from_probs(probs, ids=np.array([5, 6]))
    write_labels(tmp_path / "l.h5", ls, "mrtf", {"tau": 4}, ["a", "b"])
    back = read_labels(tmp_path / "l.h5")
    assert back.labels.tolist() == [0, 2] and back.ids.tolist() == [5, 6]
    np.testing.assert_allclose(back.probs, probs)
    assert back.attrs["method"] == "mrtf" and '"tau": 4' in back.attrs["config"]
    with h5py.File(tmp_path / "l.h5") as f:
        np.testing.assert_allclose(f["confidence"][:], [0.7, 0.8])
        assert f["entropy"].shape == (2,)
    assert [p.name for p in tmp_path.iterdir()] == ["l.h5"]  # no temporary left behind


def test_interrupted_write_leaves_nothing(tmp_path):
    class Boom(LabelSet):
        @property
        def entropy(self):
            raise KeyboardInterrupt

    ls = Boom(labels=np.zeros(2, np.int64), probs=np.ones((2, 2), np.float32) / 2)
    with pytest.raises(KeyboardInterrupt):
        write_labels(tmp_path / "l.h5", ls, "mrtf", {}, [])
    assert list(tmp_path.iterdir()) == []


def test_calibrated_confidence_written_by_blocks(tmp_path, monkeypatch):
    # the (M,) calibrated confidence is cut by the same blocks as the probabilities
    # (a refine of M > 65,536 with calibration failed on the whole array before)
    import mrtf.io.labels as labels_io

    monkeypatch.setattr(labels_io, "LABEL_BLOCK", 4)
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(3), 10).astype(np.float32)
    conf = rng.random(10).astype(np.float32)
    write_labels(tmp_path / "l.h5", LabelSet.from_probs(probs, confidence=conf), "x", {}, [])
    with h5py.File(tmp_path / "l.h5") as f:
        np.testing.assert_array_equal(f["confidence"][:], conf)


def test_row_subset_reads_the_rows_it_names(tmp_path):
    from mrtf.io.hdf5 import RowSubset

    x = np.arange(20 * 4, dtype=np.uint8).reshape(20, 1, 2, 2)
    write_dataset(tmp_path / "d.h5", x, np.arange(20))
    rows = np.array([1, 4, 5, 11, 19])
    with H5Dataset(tmp_path / "d.h5") as ds:
        sub = RowSubset(ds, rows)
        assert len(sub) == 5 and sub.sample_shape == (1, 2, 2) and not sub.has_labels
        got = np.concatenate([c for _, c in sub.chunks(2)])
        np.testing.assert_allclose(got, x[rows] / 255.0, rtol=1e-6)
        np.testing.assert_allclose(sub.read(1, 3), x[[4, 5]] / 255.0, rtol=1e-6)
        np.testing.assert_allclose(sub.take(np.array([4, 0])), x[[19, 1]] / 255.0, rtol=1e-6)
        for bad in ([], [3, 3], [5, 2], [-1, 2], [2, 20]):
            with pytest.raises(ValueError, match="strictly increasing"):
                RowSubset(ds, np.array(bad, dtype=np.int64))
