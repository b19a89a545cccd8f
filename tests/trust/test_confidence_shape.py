"""confidence_shape: each sample keeps its rank under the calibrator and takes the tempered
model's value of that rank; the mean stays the printed estimate."""

from __future__ import annotations

import numpy as np
import pytest

from mrtf.trust.calibration import Calibration, apply_temperature, temperature_for
from mrtf.trust.confidence_shape import in_order_of, tempered_in_calibrators_order


def test_values_take_the_ranks_of_the_order() -> None:
    order = np.array([0.3, 0.9, 0.1, 0.5])
    out = in_order_of(order, np.array([10.0, 20.0, 30.0, 40.0]))
    np.testing.assert_array_equal(out, [20.0, 40.0, 10.0, 30.0])
    ties = in_order_of(np.zeros(3), np.array([3.0, 1.0, 2.0]))  # ties: the samples' order
    np.testing.assert_array_equal(ties, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="alike"):
        in_order_of(order, np.ones(3))


def test_the_calibrators_order_the_tempered_values_and_the_estimate() -> None:
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(10, 0.2), 2000).astype(np.float32)
    calibrator = rng.uniform(0.55, 0.65, 2000).astype(np.float32)  # bunched, another order
    est = float(calibrator.mean())
    t = temperature_for(probs, est)
    cal = Calibration(calibrator, est, 0.126, t, "grid-fitted logistic model", [])
    out = tempered_in_calibrators_order(cal, probs)
    assert abs(float(out.confidence.mean()) - est) < 1e-5  # the estimate, exactly
    np.testing.assert_array_equal(np.argsort(out.confidence, kind="stable"),
                                  np.argsort(calibrator, kind="stable"))
    # the values are the tempered model's (up to the small shift to the exact mean)
    tempered = np.sort(apply_temperature(probs, t))
    assert np.abs(np.sort(out.confidence) - tempered).max() < 0.01
    assert out.estimated_accuracy == est and out.temperature == t and out.plus_minus == 0.126
    assert float(out.confidence.std()) > 2 * float(calibrator.std())  # spread as the model's
