"""mrtf.trust.calibration: the ± of the label-free estimate by its level (band_error), and
the lowest band's reach down to chance."""

from __future__ import annotations

import numpy as np
import pytest

from mrtf.trust.calibration import ERROR_BANDS, Calibration, Signals, band_error, calibrate


def test_each_band_gives_its_error() -> None:
    (top, e_top), (mid, e_mid), (_, e_low) = ERROR_BANDS
    assert band_error(top + 0.01, 10) == e_top
    assert band_error(mid + 0.01, 10) == e_mid
    assert band_error(0.05, 10) == e_low


def test_the_lowest_band_reaches_down_to_chance() -> None:
    low_edge = ERROR_BANDS[-2][0]
    est = low_edge - 0.01  # far enough above chance that the band alone would not reach it
    assert est - 0.1 > ERROR_BANDS[-1][1]
    assert band_error(est, 10) == pytest.approx(est - 0.1)
    assert band_error(est, 10) > band_error(est)  # without the classes: the band alone
    # fewer classes, a higher chance level: the band is enough
    assert band_error(est, 2) == ERROR_BANDS[-1][1]


def test_higher_bands_do_not_reach_for_chance() -> None:
    assert band_error(ERROR_BANDS[-2][0], 10) == ERROR_BANDS[-2][1]
    assert band_error(0.9, 10) == ERROR_BANDS[0][1]


def _low_signals(m: int = 400, c: int = 10, k: int = 5) -> tuple[Signals, np.ndarray]:
    """Parties that agree on a weak shared signal: the calibrator reads about 0.31, in the
    lowest band and more than its error above chance."""
    rng = np.random.default_rng(0)
    shared = rng.normal(0, 1, (m, c))
    logits = (shared + rng.normal(0, 1, (k, m, c))).astype(np.float32)
    probs = np.exp(logits.mean(0)) / np.exp(logits.mean(0)).sum(1, keepdims=True)
    s = Signals.from_logits(logits, probs, probs)
    s.neighbours = rng.integers(0, m, (m, 10))
    return s, probs


def test_calibrate_prints_the_chance_reaching_interval_on_a_low_estimate() -> None:
    s, probs = _low_signals()
    cal = calibrate(probs, s, fit_temperature=False)
    assert 0.1 + ERROR_BANDS[-1][1] < cal.estimated_accuracy < ERROR_BANDS[-2][0]
    assert cal.plus_minus == pytest.approx(band_error(cal.estimated_accuracy, 10))
    assert cal.estimated_accuracy - cal.plus_minus == pytest.approx(0.1)


def test_the_reach_is_said_in_the_notes_only_when_it_widens() -> None:
    s, probs = _low_signals()
    assert any("reaches down to chance" in n for n in calibrate(probs, s).notes)
    rng = np.random.default_rng(1)
    sure = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 400)] * 8
    logits = np.broadcast_to(sure, (5, 400, 10)).copy()
    p = np.exp(logits[0]) / np.exp(logits[0]).sum(1, keepdims=True)
    t = Signals.from_logits(logits, p, p)
    t.neighbours = rng.integers(0, 400, (400, 10))
    cal = calibrate(p, t, fit_temperature=False)
    assert cal.estimated_accuracy > ERROR_BANDS[-2][0]
    assert not any("chance" in n for n in cal.notes)


def _cal(est: float, pm: float) -> Calibration:
    return Calibration(np.full(100, est, np.float32), est, pm, 1.0, "test")


def _sure(own: float, m: int = 100, c: int = 10) -> np.ndarray:
    """Probabilities whose max is ``own`` on every row."""
    p = np.full((m, c), (1 - own) / (c - 1), np.float32)
    p[:, 0] = own
    return p


def test_the_top_band_reaches_the_labels_own_confidence() -> None:
    from mrtf.trust.calibration import reaching_own_confidence

    top, e_top = ERROR_BANDS[0]
    cal = _cal(top + 0.02, e_top)
    out = reaching_own_confidence(cal, _sure(top + 0.09))
    assert out.plus_minus == pytest.approx(0.07, abs=1e-6)
    assert out.estimated_accuracy == cal.estimated_accuracy  # the reading stays
    assert any("own confidence reads" in n for n in out.notes)
    # a near own reading changes nothing
    assert reaching_own_confidence(cal, _sure(top + 0.03)) is cal


def test_below_the_top_band_the_own_confidence_is_not_read() -> None:
    from mrtf.trust.calibration import reaching_own_confidence

    cal = _cal(ERROR_BANDS[0][0] - 0.05, ERROR_BANDS[1][1])
    assert reaching_own_confidence(cal, _sure(0.99)) is cal
