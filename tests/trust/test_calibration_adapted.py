"""calibration.widened_for_adapted: adapted labels get a ± that reaches their own mean
confidence, and nothing else changes."""

from __future__ import annotations

import numpy as np

from mrtf.trust.calibration import Calibration, widened_for_adapted


def _cal(est: float, pm: float) -> Calibration:
    conf = np.full(10, est, np.float32)
    return Calibration(conf, est, pm, 1.5, "grid-fitted logistic model", ["kept"])


def _probs(top: float) -> np.ndarray:
    p = np.full((10, 4), (1 - top) / 3, np.float32)
    p[:, 1] = top
    return p


def test_the_interval_reaches_the_labels_own_confidence() -> None:
    out = widened_for_adapted(_cal(0.80, 0.126), _probs(0.99))
    assert abs(out.plus_minus - 0.19) < 1e-6  # |0.99 - 0.80|
    assert out.estimated_accuracy == 0.80 and out.temperature == 1.5
    np.testing.assert_array_equal(out.confidence, np.full(10, 0.80, np.float32))
    assert out.notes[0] == "kept" and "the ± spans both" in out.notes[1]
    assert "0.800" in out.notes[1] and "0.990" in out.notes[1]


def test_unchanged_when_both_readings_agree_within_the_interval() -> None:
    cal = _cal(0.95, 0.027)
    assert widened_for_adapted(cal, _probs(0.97)) is cal
    low = _cal(0.60, 0.126)  # a too-confident estimate widens as well (the gap is |.|)
    assert abs(widened_for_adapted(low, _probs(0.40)).plus_minus - 0.20) < 1e-6
