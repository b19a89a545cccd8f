"""mrtf.trust.calibration: the ± of the label-free estimate by its level (band_error), and
the lowest band's reach down to chance."""

from __future__ import annotations

import numpy as np
import pytest

from mrtf.trust.calibration import ERROR_BANDS, Signals, band_error, calibrate, uncalibrated


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


def test_a_models_own_confidence_names_itself() -> None:
    probs = np.full((20, 4), 0.1, np.float32)
    probs[:, 0] = 0.7
    assert uncalibrated(probs).reading == "uncalibrated"
    assert uncalibrated(probs, temperature=2.0).reading == "tempered"
    assert "reading" in uncalibrated(probs).attrs()  # the labels file records it
