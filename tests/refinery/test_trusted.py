"""refinery.trusted.calibrated: which reading of the labels' accuracy refine prints."""

from __future__ import annotations

import numpy as np
import pytest

from mrtf.refinery.trusted import calibrated
from mrtf.trust.calibration import Signals, apply_temperature, calibrate, own_confidence
from mrtf.trust.midpoint_estimate import MIDPOINT_FROM, READINGS


def _signals(margin: float, m: int = 400, c: int = 10, seed: int = 0
             ) -> tuple[np.ndarray, Signals]:
    """Four parties that agree with ``margin`` on balanced classes, neighbours in-class."""
    rng = np.random.default_rng(seed)
    y = np.arange(m) % c
    logits = rng.normal(0, 1, (4, m, c)).astype(np.float32)
    logits[:, np.arange(m), y] += margin
    p = np.exp(logits[0]) / np.exp(logits[0]).sum(1, keepdims=True)
    s = Signals.from_logits(logits, p, p)
    s.neighbours = np.stack([rng.choice(np.flatnonzero(y == k), 10) for k in y])
    return p.astype(np.float32), s


@pytest.mark.parametrize("margin", [6.0, 1.5])
def test_voted_labels_are_read_midway_only_when_read_as_mostly_right(margin: float) -> None:
    probs, s = _signals(margin)
    plain = calibrate(probs, s, fit_temperature=False)
    cal, acc = calibrated(probs, probs, s, None)
    if plain.estimated_accuracy >= MIDPOINT_FROM:
        mid = (plain.estimated_accuracy + own_confidence(probs)) / 2
        assert cal.estimated_accuracy == pytest.approx(mid, abs=1e-6)
        assert "mostly right" in cal.notes[-1]
    else:
        assert cal.estimated_accuracy == plain.estimated_accuracy
        assert cal.plus_minus == plain.plus_minus
    assert acc.refined == cal.estimated_accuracy and acc.plus_minus == cal.plus_minus
    # the temperature gives the printed estimate, whichever reading it is
    assert float(apply_temperature(probs, cal.temperature).mean()) == \
        pytest.approx(cal.estimated_accuracy, abs=2e-3)


def test_both_margins_fall_on_either_side_of_the_edge() -> None:
    high = calibrate(*_signals(6.0), fit_temperature=False).estimated_accuracy
    low = calibrate(*_signals(1.5), fit_temperature=False).estimated_accuracy
    assert low < MIDPOINT_FROM <= high


def test_adapted_labels_are_read_midway_at_any_level() -> None:
    probs, s = _signals(1.5)
    cal, _ = calibrated(probs, probs, s, None, adapted=True)
    plain = calibrate(probs, s, fit_temperature=False)
    assert cal.estimated_accuracy == pytest.approx(
        (plain.estimated_accuracy + own_confidence(probs)) / 2, abs=1e-6)
    assert "adapted" in cal.notes[-1]


def test_voted_labels_in_the_middle_band_get_a_plus_minus_reaching_their_own_confidence(
) -> None:
    probs, s = _signals(2.5)  # the calibrator reads ~0.71, the labels' own confidence ~0.52
    plain = calibrate(probs, s, fit_temperature=False)
    assert 0.40 <= plain.estimated_accuracy < MIDPOINT_FROM
    gap = abs(own_confidence(probs) - plain.estimated_accuracy)
    assert gap > plain.plus_minus
    cal, acc = calibrated(probs, probs, s, None)
    assert cal.estimated_accuracy == plain.estimated_accuracy  # the estimate stays
    assert cal.plus_minus == pytest.approx(gap, abs=1e-9) and acc.plus_minus == cal.plus_minus
    assert "reaches the other" in cal.notes[-1]


@pytest.mark.parametrize("margin", [6.0, 2.5, 1.5])
def test_each_sample_keeps_its_calibrated_rank_and_the_mean_is_the_estimate(margin) -> None:
    probs, s = _signals(margin)
    plain = calibrate(probs, s, fit_temperature=False)
    cal, _ = calibrated(probs, probs, s, None)
    assert float(cal.confidence.mean()) == pytest.approx(cal.estimated_accuracy, abs=1e-5)
    # the calibrator's order (the midpoint's one logit shift keeps it too)
    np.testing.assert_array_equal(np.argsort(cal.confidence, kind="stable"),
                                  np.argsort(plain.confidence, kind="stable"))
    # the values: the refined model's max probability at the temperature refine carries
    tempered = np.sort(apply_temperature(probs, cal.temperature))
    assert np.abs(np.sort(cal.confidence) - tempered).max() < 0.01


@pytest.mark.parametrize("margin", [6.0, 2.5, 1.5, 0.0])
def test_the_estimate_names_the_rule_that_printed_it(margin: float) -> None:
    probs, s = _signals(margin)
    plain = calibrate(probs, s, fit_temperature=False).estimated_accuracy
    cal, acc = calibrated(probs, probs, s, None)
    want = ("midway (sure labels)" if plain >= MIDPOINT_FROM else
            "middle band" if plain >= 0.40 else "lowest band")
    assert cal.reading == acc.reading == want and want in READINGS
    assert acc.to_dict()["reading"] == want  # what --json says
    adapted, acc = calibrated(probs, probs, s, None, adapted=True)
    assert adapted.reading == acc.reading == "midway (adapted)"


def test_the_four_margins_reach_the_three_voted_rules() -> None:
    read = {m: calibrate(*_signals(m), fit_temperature=False).estimated_accuracy
            for m in (6.0, 2.5, 0.0)}
    assert read[6.0] >= MIDPOINT_FROM > read[2.5] >= 0.40 > read[0.0]
