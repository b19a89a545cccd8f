"""cluster_torch.py (the torch backend on device "cpu", and on CUDA where present) against
cluster.py's CPU path (faiss-cpu and numpy) on real digits: the CLR targets, the k-means
view, spilled features. On CUDA the products round differently: the CLR targets are held to
1e-5 and the k-means ids to 99.5 % of the rows (faiss's early stop can move an iteration)."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from mrtf.compute.backend import Backend
from mrtf.refinery.cluster import kmeans_assign, kmeans_view, prototype_targets
from mrtf.refinery.spill import Scratch

TORCH = Backend("torch", torch.device("cpu"))
HOST = Backend("faiss-cpu", torch.device("cpu"))
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def digits():
    """Digits pixels as features, and targets that are 70 % right (labels used to build
    them, as a distilled model's features and noisy soft labels would be)."""
    d = load_digits()
    rng = np.random.default_rng(0)
    noisy = np.where(rng.random(len(d.target)) < 0.7, d.target, rng.integers(0, 10, 1797))
    targets = np.full((1797, 10), 0.02, np.float32)
    targets[np.arange(1797), noisy] = 0.82
    return d.data.astype(np.float32), targets


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["paper", "reference"])
def test_clr_targets_equal_the_cpu_path(digits, variant, device):
    feats, targets = digits
    want = prototype_targets(targets, feats, iterations=2, variant=variant, chunk=500,
                             backend=HOST)
    got = prototype_targets(targets, feats, iterations=2, variant=variant, chunk=500,
                            backend=Backend("torch", torch.device(device)))
    np.testing.assert_allclose(got, want, atol=1e-6 if device == "cpu" else 1e-5)
    np.testing.assert_array_equal(got.argmax(1), want.argmax(1))
    # the default (use_gpu off) is the CPU path itself
    np.testing.assert_array_equal(prototype_targets(targets, feats, iterations=2,
                                                    variant=variant, chunk=500), want)


def test_clr_excludes_a_class_without_mass(digits):
    feats, targets = digits
    targets = targets.copy()
    targets[:, 3] = 0.0
    got = prototype_targets(targets, feats, backend=TORCH)
    assert (got[:, 3] == 0).all()
    np.testing.assert_allclose(got, prototype_targets(targets, feats, backend=HOST), atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_kmeans_view_equals_the_cpu_path(digits, device):
    """20 clusters of 1,797 digits, trained on a seeded 1,000 (50 per cluster), every row
    assigned: the same cluster ids (mrtf.compute.kmeans follows faiss step for step)."""
    feats, _ = digits
    torch_backend = Backend("torch", torch.device(device))
    want, n = kmeans_assign(feats, 20, seed=1, max_points_per_centroid=50, block=700,
                            backend=HOST)
    got, m = kmeans_assign(feats, 20, seed=1, max_points_per_centroid=50, block=700,
                           backend=torch_backend)
    assert n == m == 20
    if device == "cpu":
        np.testing.assert_array_equal(got, want)
    else:
        assert (got == want).mean() >= 0.995
    np.testing.assert_array_equal(kmeans_view(feats, 20, 1, 25, 50, torch_backend).argmax(1),
                                  got)


def test_spilled_features_on_the_torch_backend(digits, tmp_path):
    feats, targets = digits
    with Scratch(tmp_path) as sc:
        spill = sc.array("f", feats.shape)
        spill.write(0, feats)
        a, _ = kmeans_assign(spill, 8, seed=2, max_points_per_centroid=50, block=300,
                             backend=TORCH)
        np.testing.assert_array_equal(a, kmeans_assign(feats, 8, seed=2,
                                                        max_points_per_centroid=50,
                                                        backend=TORCH)[0])
        np.testing.assert_array_equal(prototype_targets(targets, spill, chunk=256,
                                                        backend=TORCH),
                                      prototype_targets(targets, feats, chunk=256,
                                                        backend=TORCH))
