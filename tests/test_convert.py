import numpy as np
import pytest
from PIL import Image

from mrtf.data import import_to_h5
from mrtf.errors import InputError
from mrtf.io import read_dataset


def test_npz_import(tmp_path):
    x = np.random.default_rng(0).integers(0, 256, (12, 8, 8), dtype=np.uint8)
    np.savez(tmp_path / "a.npz", x=x, y=np.arange(12) % 4)
    import_to_h5(tmp_path / "a.npz", tmp_path / "a.h5")
    xr, yr = read_dataset(tmp_path / "a.h5")
    assert xr.shape == (12, 1, 8, 8)
    np.testing.assert_allclose(xr[:, 0], x / 255.0, rtol=1e-6)
    assert yr.tolist() == (np.arange(12) % 4).tolist()


def test_npy_pair_nhwc(tmp_path):
    x = np.random.default_rng(0).random((5, 6, 6, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.arange(5))
    import_to_h5(tmp_path / "x.npy", tmp_path / "o.h5", labels=tmp_path / "y.npy")
    xr, yr = read_dataset(tmp_path / "o.h5")
    assert xr.shape == (5, 3, 6, 6) and yr.tolist() == [0, 1, 2, 3, 4]


def test_npy_label_count_mismatch(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((5, 4, 4), np.float32))
    np.save(tmp_path / "y.npy", np.arange(4))
    with pytest.raises(InputError, match="5 samples but 4 labels"):
        import_to_h5(tmp_path / "x.npy", tmp_path / "o.h5", labels=tmp_path / "y.npy")
    assert not (tmp_path / "o.h5").exists()


def _png(path, value):
    Image.fromarray(np.full((10, 10), value, dtype=np.uint8)).save(path)


def test_image_folder_labeled_and_flat(tmp_path):
    for cls, value in (("cat", 10), ("dog", 200)):
        (tmp_path / "lab" / cls).mkdir(parents=True)
        for i in range(3):
            _png(tmp_path / "lab" / cls / f"{i}.png", value)
    import_to_h5(tmp_path / "lab", tmp_path / "lab.h5", image_size=8)
    x, y = read_dataset(tmp_path / "lab.h5")
    assert x.shape == (6, 1, 8, 8) and y.tolist() == [0, 0, 0, 1, 1, 1]
    assert abs(float(x[0].mean()) - 10 / 255) < 1e-3
    (tmp_path / "flat").mkdir()
    _png(tmp_path / "flat" / "a.png", 5)
    import_to_h5(tmp_path / "flat", tmp_path / "flat.h5", channels=3)
    x, y = read_dataset(tmp_path / "flat.h5")
    assert x.shape == (1, 3, 10, 10) and y is None


def test_empty_folder(tmp_path):
    (tmp_path / "e").mkdir()
    with pytest.raises(InputError, match="no images"):
        import_to_h5(tmp_path / "e", tmp_path / "e.h5")
