import numpy as np
import pytest

from mrtf.data import client_class_counts, parse_split, split_clients
from mrtf.errors import InputError

Y = np.repeat(np.arange(10), 200)  # 2,000 samples, 10 balanced classes


@pytest.mark.parametrize("spec", ["iid", "label:3", "label:1", "dirichlet:0.1", "dirichlet:10"])
def test_every_sample_used_once_and_every_client_nonempty(spec):
    parts = split_clients(Y, 20, spec, seed=0)
    assert len(parts) == 20
    assert all(len(p) > 0 for p in parts)
    allidx = np.concatenate(parts)
    assert len(allidx) == len(np.unique(allidx))
    if spec != "label:1":  # label:1 with 20 clients uses every class, so all samples too
        assert len(allidx) == len(Y)


@pytest.mark.parametrize("cbar", [1, 2, 3, 5])
def test_label_split_gives_exactly_cbar_classes(cbar):
    for seed in range(5):
        parts = split_clients(Y, 20, f"label:{cbar}", seed=seed)
        seen = (client_class_counts(Y, parts, 10) > 0).sum(1)
        assert (seen == cbar).all(), seen


def test_label_split_classes_roughly_balanced_within_client():
    parts = split_clients(Y, 20, "label:2", seed=1)
    counts = client_class_counts(Y, parts, 10)
    for row in counts:
        nz = row[row > 0]
        assert nz.max() <= 2 * nz.min()


def _skew(spec, seed=0):
    """Mean over clients of the largest class share."""
    parts = split_clients(Y, 20, spec, seed=seed)
    counts = client_class_counts(Y, parts, 10).astype(float)
    return (counts.max(1) / counts.sum(1)).mean()


def test_dirichlet_small_alpha_skewed_large_alpha_uniform():
    assert _skew("dirichlet:0.1") > 0.5
    assert _skew("dirichlet:1000") < 0.2  # uniform would be 0.1
    assert _skew("iid") < 0.2


def test_split_is_deterministic_per_seed():
    a = split_clients(Y, 10, "dirichlet:0.3", seed=3)
    b = split_clients(Y, 10, "dirichlet:0.3", seed=3)
    c = split_clients(Y, 10, "dirichlet:0.3", seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_class_counts_matrix():
    parts = [np.array([0, 1, 200]), np.array([201, 400])]
    counts = client_class_counts(Y, parts, 10)
    assert counts.shape == (2, 10)
    assert counts[0, 0] == 2 and counts[0, 1] == 1 and counts[1, 1] == 1 and counts[1, 2] == 1


@pytest.mark.parametrize("bad", ["dirichlet:-1", "dirichlet:0", "label:0", "label:2.5",
                                 "dirichlet:abc", "shards:2", "", "label"])
def test_bad_specs_rejected(bad):
    with pytest.raises(InputError):
        parse_split(bad)


def test_label_split_more_classes_than_exist():
    with pytest.raises(InputError):
        split_clients(Y, 5, "label:11", seed=0)


def test_parse_roundtrip():
    assert str(parse_split("dirichlet:0.1")) == "dirichlet:0.1"
    assert str(parse_split("label:3")) == "label:3"
    assert parse_split("IID").kind == "iid"
