"""midpoint_estimate: adapted labels, and others read as mostly right, are estimated midway
between the calibrator's reading and their own mean confidence, with a ± reaching both, and
each sample's confidence follows the estimate without changing its order."""

from __future__ import annotations

import numpy as np

from mrtf.trust.calibration import Calibration, apply_temperature, band_error
from mrtf.trust.midpoint_estimate import (
    MIDPOINT_FROM,
    midpoint_for_adapted,
    midpoint_for_sure_labels,
    reads_midway,
    shifted_to_mean,
)


def _cal(conf: np.ndarray, pm: float) -> Calibration:
    conf = np.asarray(conf, np.float32)
    return Calibration(conf, float(conf.mean()), pm, 1.5, "grid-fitted logistic model",
                       ["kept"])


def _probs(top: float, m: int = 1000) -> np.ndarray:
    p = np.full((m, 4), (1 - top) / 3, np.float32)
    p[:, 1] = top
    return p


def test_the_estimate_is_midway_and_the_interval_reaches_both_readings() -> None:
    out = midpoint_for_adapted(_cal(np.full(1000, 0.90), 0.027), _probs(0.99))
    assert abs(out.estimated_accuracy - 0.945) < 1e-5
    # |0.99 - 0.90| / 2 and 2 binomial standard errors of 0.945 on 1,000 samples
    assert abs(out.plus_minus - 0.045 - 2 * np.sqrt(0.945 * 0.055 / 1000)) < 1e-5
    assert out.estimated_accuracy - out.plus_minus <= 0.90 + 1e-5
    assert out.estimated_accuracy + out.plus_minus >= 0.99 - 1e-5
    assert abs(float(out.confidence.mean()) - 0.945) < 1e-5
    assert out.notes[0] == "kept" and "midway" in out.notes[1]
    assert "0.900" in out.notes[1] and "0.990" in out.notes[1]


def test_the_temperature_gives_the_new_estimate() -> None:
    probs = np.random.default_rng(0).dirichlet(np.full(4, 0.3), 200).astype(np.float32)
    out = midpoint_for_adapted(_cal(np.full(200, 0.5), 0.126), probs)
    assert out.temperature != 1.5
    assert abs(float(apply_temperature(probs, out.temperature).mean())
               - out.estimated_accuracy) < 1e-3


def test_readings_that_agree_keep_the_calibrators_own_interval() -> None:
    out = midpoint_for_adapted(_cal(np.full(400, 0.97), 0.027), _probs(0.97, 400))
    assert abs(out.estimated_accuracy - 0.97) < 1e-5
    assert abs(out.plus_minus - 0.027) < 1e-9  # not zero
    few = midpoint_for_adapted(_cal(np.full(20, 0.97), 0.027), _probs(0.97, 20))
    assert abs(few.plus_minus - 2 * np.sqrt(0.97 * 0.03 / 20)) < 1e-6  # sampling, if larger
    one = midpoint_for_adapted(_cal(np.full(1, 0.5), 0.027), _probs(0.9, 1))
    assert np.isfinite(one.plus_minus) and one.plus_minus > 0.2


def test_a_too_confident_calibrator_is_pulled_down_and_its_interval_is_a_floor() -> None:
    out = midpoint_for_adapted(_cal(np.full(1000, 0.56), 0.126), _probs(0.44))
    assert abs(out.estimated_accuracy - 0.50) < 1e-5
    assert out.plus_minus == 0.126 > 0.06 + 0.032  # the calibrator's ±, not half the gap


def test_the_floor_is_the_calibrators_interval_not_the_band_of_the_midpoint() -> None:
    # a calibrator just under the top band's edge (its ± 0.126) and a midpoint above it: the
    # interval keeps the calibrator's ±, not the narrower top band's
    cal = _cal(np.full(1000, 0.84), band_error(0.84))
    out = midpoint_for_adapted(cal, _probs(0.89))
    assert out.estimated_accuracy > 0.85 and band_error(out.estimated_accuracy) < 0.05
    assert out.plus_minus == band_error(0.84) == 0.126


def test_the_shift_keeps_the_order_and_the_bounds() -> None:
    conf = np.random.default_rng(1).uniform(0.05, 0.95, 500).astype(np.float32)
    for mean in (0.2, float(conf.mean()), 0.9):
        out = shifted_to_mean(conf, mean)
        assert abs(float(out.mean()) - mean) < 1e-5
        assert np.all((out > 0) & (out < 1))
        np.testing.assert_array_equal(np.argsort(out, kind="stable"),
                                      np.argsort(conf, kind="stable"))


def test_labels_that_are_not_adapted_are_read_midway_only_when_read_as_mostly_right() -> None:
    below = _cal(np.full(1000, MIDPOINT_FROM - 0.01), 0.126)
    above = _cal(np.full(1000, MIDPOINT_FROM + 0.01), 0.126)
    assert not reads_midway(below) and reads_midway(above)


def test_sure_labels_that_read_low_move_towards_their_own_confidence() -> None:
    # ten parties on a new domain: the calibrator read 0.83, the labels' own confidence 0.93
    out = midpoint_for_sure_labels(_cal(np.full(1000, 0.83), 0.126), _probs(0.93))
    assert abs(out.estimated_accuracy - 0.88) < 1e-5
    assert out.plus_minus == 0.126  # the calibrator's band at its reading is the floor
    top = midpoint_for_sure_labels(_cal(np.full(1000, 0.87), 0.027), _probs(0.94))
    assert abs(top.estimated_accuracy - 0.905) < 1e-5
    assert top.estimated_accuracy - top.plus_minus <= 0.87 + 1e-6
    assert top.estimated_accuracy + top.plus_minus >= 0.94 - 1e-6
    assert "mostly right" in top.notes[-1] and "0.870" in top.notes[-1]
    assert "adapted" not in top.notes[-1]
    assert abs(float(top.confidence.mean()) - 0.905) < 1e-5
