"""FedKF's AMP / FM / WLP (mrtf.federated.fairness) on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from mrtf.federated.fairness import client_accuracies, fairness_metrics, split_local_test


def test_metrics_by_hand():
    # a_k = 1.0, 0.5, 0.0 with |D_k| = 10, 30, 60
    m = fairness_metrics(np.array([1.0, 0.5, 0.0]), np.array([10, 30, 60]))
    assert m["amp"] == pytest.approx((10 * 1.0 + 30 * 0.5) / 100)
    assert m["fm"] == pytest.approx(((1 - 0.5) ** 2 + 0 + (0 - 0.5) ** 2) / 3)  # 1/K, not 1/(K-1)
    assert m["wlp"] == 0.0


def test_clients_without_a_test_part_are_left_out():
    m = fairness_metrics(np.array([0.8, np.nan, 0.4]), np.array([10, 1000, 30]))
    assert m == pytest.approx({"amp": (8 + 12) / 40, "fm": 0.04, "wlp": 0.4})
    assert fairness_metrics(np.array([np.nan]), np.array([3])) == dict.fromkeys(
        ("amp", "fm", "wlp"))


def test_split_is_a_deterministic_partition():
    parts = [np.arange(0, 10), np.arange(10, 13), np.arange(13, 14), np.arange(14, 114)]
    train, test = split_local_test(parts, 0.2, seed=3)
    for p, a, b in zip(parts, train, test):
        assert sorted(np.concatenate([a, b]).tolist()) == p.tolist()
        assert len(a) >= 1 and not set(a) & set(b)
    assert [len(b) for b in test] == [2, 0, 0, 20]
    again = split_local_test(parts, 0.2, seed=3)[1]
    assert all(np.array_equal(a, b) for a, b in zip(test, again))
    other = split_local_test(parts, 0.2, seed=4)[1]
    assert not np.array_equal(test[3], other[3])
    with pytest.raises(ValueError):
        split_local_test(parts, 1.0, seed=0)


class Threshold(nn.Module):
    """Predicts class 1 when the first pixel is > 0.5, else class 0."""

    def forward(self, x):
        v = x.flatten(1)[:, :1]
        return torch.cat([0.5 - v, v - 0.5], dim=1)


def test_client_accuracies_match_a_count():
    x = torch.tensor([0.9, 0.1, 0.9, 0.1, 0.9, 0.2]).view(6, 1, 1, 1)
    y = torch.tensor([1, 0, 0, 0, 0, 1])
    accs = client_accuracies(Threshold(), x, y, [np.array([0, 1]), np.array([], int),
                                                 np.array([2, 3, 4, 5])], batch_size=3)
    assert accs[0] == 1.0 and np.isnan(accs[1]) and accs[2] == 0.25
