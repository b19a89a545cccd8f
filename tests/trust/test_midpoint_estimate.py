"""midpoint_estimate: adapted labels, and others read as mostly right, are estimated midway
between the calibrator's reading and their own mean confidence, with a ± reaching both, and
each sample's confidence follows the estimate without changing its order; in the calibrator's
middle band its ± reaches the labels' own confidence."""

from __future__ import annotations

import numpy as np
import pytest

from mrtf.trust.calibration import Calibration, apply_temperature, band_error
from mrtf.trust.midpoint_estimate import (
    MIDPOINT_FROM,
    READINGS,
    SHARED_ERROR,
    SHARED_SHARE,
    down_to_the_vote,
    midpoint_for_adapted,
    midpoint_for_sure_labels,
    midpoint_plus_minus,
    reaches_own_confidence,
    reaching_own_confidence,
    reaching_the_even_reading,
    reads_midway,
    shared_error,
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
    # |0.99 - 0.90| / 2, 2 binomial standard errors of 0.945 on 1,000 samples, and what both
    # readings can share
    assert abs(out.plus_minus - 0.045 - 2 * np.sqrt(0.945 * 0.055 / 1000)
               - shared_error(0.945)) < 1e-5
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


def test_readings_that_agree_still_allow_for_an_error_they_share() -> None:
    out = midpoint_for_adapted(_cal(np.full(400, 0.97), 0.027), _probs(0.97, 400))
    assert abs(out.estimated_accuracy - 0.97) < 1e-5
    assert abs(out.plus_minus - 2 * np.sqrt(0.97 * 0.03 / 400) - shared_error(0.97)) < 1e-6
    few = midpoint_for_adapted(_cal(np.full(20, 0.97), 0.027), _probs(0.97, 20))
    assert abs(few.plus_minus - 2 * np.sqrt(0.97 * 0.03 / 20) - shared_error(0.97)) < 1e-6
    one = midpoint_for_adapted(_cal(np.full(1, 0.5), 0.027), _probs(0.9, 1))
    assert np.isfinite(one.plus_minus) and one.plus_minus > 0.2


def test_a_too_confident_calibrator_is_pulled_down() -> None:
    out = midpoint_for_adapted(_cal(np.full(1000, 0.56), 0.126), _probs(0.44))
    assert abs(out.estimated_accuracy - 0.50) < 1e-5
    assert abs(out.plus_minus - 0.06 - 2 * np.sqrt(0.25 / 1000) - SHARED_ERROR) < 1e-6


def test_the_interval_no_longer_takes_the_calibrators_band_as_its_floor() -> None:
    # a calibrator just under the top band's edge (its ± 0.126) and readings 5 points apart:
    # the ± is what the two readings say, narrower than the calibrator's band
    out = midpoint_for_adapted(_cal(np.full(1000, 0.84), band_error(0.84)), _probs(0.89))
    expected = 0.025 + 2 * np.sqrt(0.865 * 0.135 / 1000) + shared_error(0.865)
    assert abs(out.plus_minus - expected) < 1e-6 and out.plus_minus < band_error(0.84)
    assert abs(midpoint_plus_minus(0.84, 0.89, 1000, 0.126) - out.plus_minus) < 1e-6


def test_in_the_lowest_band_the_calibrators_interval_to_chance_is_the_floor() -> None:
    # the calibrator reads most labels wrong: its ± reaches chance, and the midpoint keeps it
    out = midpoint_for_adapted(_cal(np.full(1000, 0.30), band_error(0.30, 10)), _probs(0.40))
    assert abs(out.estimated_accuracy - 0.35) < 1e-5
    assert abs(out.plus_minus - band_error(0.30, 10)) < 1e-9 and abs(out.plus_minus - 0.2) < 1e-6
    assert midpoint_plus_minus(0.45, 0.40, 1000, 0.126) < 0.126  # above that band: no floor


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
    assert abs(out.plus_minus - 0.05 - 2 * np.sqrt(0.88 * 0.12 / 1000) - shared_error(0.88)) < 1e-6
    top = midpoint_for_sure_labels(_cal(np.full(1000, 0.87), 0.027), _probs(0.94))
    assert abs(top.estimated_accuracy - 0.905) < 1e-5
    assert top.estimated_accuracy - top.plus_minus <= 0.87 + 1e-6
    assert top.estimated_accuracy + top.plus_minus >= 0.94 - 1e-6
    assert "mostly right" in top.notes[-1] and "0.870" in top.notes[-1]
    assert "adapted" not in top.notes[-1]
    assert abs(float(top.confidence.mean()) - 0.905) < 1e-5


def test_in_the_middle_band_the_interval_reaches_the_labels_own_confidence() -> None:
    # scikit-digits parties on MNIST: the calibrator read 0.55, the labels' own confidence 0.83
    cal = _cal(np.full(1000, 0.55), 0.126)
    assert reaches_own_confidence(cal)
    out = reaching_own_confidence(cal, _probs(0.83))
    assert out.estimated_accuracy == cal.estimated_accuracy  # the estimate stays
    assert abs(out.plus_minus - 0.28) < 1e-5
    assert "0.550" in out.notes[-1] and "0.830" in out.notes[-1] and "reaches" in out.notes[-1]
    np.testing.assert_array_equal(out.confidence, cal.confidence)
    near = reaching_own_confidence(cal, _probs(0.60))  # nearer than the band: unchanged
    assert (near.plus_minus, near.notes, near.reading) == (cal.plus_minus, cal.notes,
                                                           "middle band")


def test_only_the_middle_band_reaches() -> None:
    assert not reaches_own_confidence(_cal(np.full(100, 0.30), 0.2))  # lowest band: to chance
    assert not reaches_own_confidence(_cal(np.full(100, MIDPOINT_FROM), 0.126))  # midway
    assert reaches_own_confidence(_cal(np.full(100, 0.40), 0.126))


def test_the_shared_error_is_a_share_of_what_is_read_wrong_up_to_a_cap() -> None:
    assert shared_error(0.50) == SHARED_ERROR  # capped
    assert abs(shared_error(0.97) - SHARED_SHARE * 0.03) < 1e-12  # near 1: a share of 3 %
    assert shared_error(1.0) == 0.0
    assert shared_error(0.90) <= shared_error(0.80) <= shared_error(0.60)


def test_the_adapted_votes_interval_reaches_down_to_the_votes() -> None:
    """Option adapt_vote: the labels' own reading widened down to the lower end of the
    vote's interval before SHOT (its upper end is not reached); the estimate is the middle."""
    read, vote = _cal(np.full(1000, 0.80), 0.10), _cal(np.full(1000, 0.63), 0.20)
    out = down_to_the_vote(read, vote, _probs(0.95))
    assert abs(out.estimated_accuracy - (0.43 + 0.90) / 2) < 1e-6
    assert abs(out.plus_minus - (0.90 - 0.43) / 2) < 1e-6
    assert abs(float(out.confidence.mean()) - out.estimated_accuracy) < 1e-4
    assert abs(float(apply_temperature(_probs(0.95), out.temperature).mean())
               - out.estimated_accuracy) < 1e-3
    assert "0.630 ± 0.200" in out.notes[-1] and "reaches down to the vote's" in out.notes[-1]
    # a vote whose interval starts higher widens nothing: the labels' own reading stands
    assert down_to_the_vote(read, _cal(np.full(1000, 0.85), 0.05), _probs(0.95)) is read


def test_the_interval_reaches_the_even_reading_only_where_it_lies_outside():
    cal = _cal(np.full(400, 0.99), 0.008)
    wide = reaching_the_even_reading(cal, 0.96)
    assert wide.estimated_accuracy == cal.estimated_accuracy  # the estimate stays
    assert wide.plus_minus == pytest.approx(0.03, abs=1e-6)
    assert "0.960" in wide.notes[-1]
    assert reaching_the_even_reading(cal, 0.985) is cal  # inside already: unchanged


def test_each_rule_names_itself() -> None:
    probs = _probs(0.99)
    sure = midpoint_for_sure_labels(_cal(np.full(1000, 0.90), 0.027), probs)
    adapted = midpoint_for_adapted(_cal(np.full(1000, 0.90), 0.027), probs)
    middle = reaching_own_confidence(_cal(np.full(1000, 0.60), 0.126), probs)
    near = reaching_own_confidence(_cal(np.full(1000, 0.60), 0.5), probs)  # not widened
    assert (sure.reading, adapted.reading) == ("midway (sure labels)", "midway (adapted)")
    assert middle.reading == near.reading == "middle band"
    vote = _cal(np.full(1000, 0.50), 0.126)
    down = down_to_the_vote(_cal(np.full(1000, 0.90), 0.03), vote, probs)
    assert down.reading == "down to the vote"
    kept = down_to_the_vote(_cal(np.full(1000, 0.90), 0.03), _cal(np.full(1000, 0.97), 0.03),
                            probs)
    assert kept.reading == "calibrator"  # the read labels' own rule: not widened
    assert {sure.reading, adapted.reading, middle.reading, down.reading} <= set(READINGS)
