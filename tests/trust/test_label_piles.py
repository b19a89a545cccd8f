"""Classes the labels pile onto (mrtf.trust.label_piles), and refine naming them."""

from __future__ import annotations

import numpy as np
import pytest

from mrtf.trust.class_frequencies import normalised
from mrtf.trust.label_piles import LabelPile, label_piles


def _labels(counts):
    return np.repeat(np.arange(len(counts)), counts)


def test_a_class_with_twice_its_even_share_is_a_pile():
    labels = _labels([300, 80, 80, 80, 80, 80, 80, 80, 80, 60])  # class 0: 30 % of 1,000
    piles = label_piles(labels, 10)
    assert piles == [LabelPile(0, 300, 0.3, 0.1, False)]
    line = piles[0].line()
    assert "class 0: 300 samples (30.0%, 3.0× an even share)" in line
    assert "mostly wrong" in line


def test_balanced_labels_and_mild_skews_are_no_pile():
    assert label_piles(_labels([100] * 10), 10) == []
    # USPS's test set: its largest class is 1.79× an even share
    assert label_piles(_labels([359, 264, 198, 166, 200, 160, 170, 147, 166, 177]), 10) == []


def test_the_pile_is_measured_against_the_given_frequencies():
    counts = [600, 50, 50, 50, 50, 50, 50, 50, 50, 50]
    assert [p.label for p in label_piles(_labels(counts), 10)] == [0]
    told = normalised(counts)  # the user says class 0 is that common
    assert label_piles(_labels(counts), 10, told) == []
    rare = normalised([0.01] + [0.11] * 9)
    piles = label_piles(_labels(counts), 10, rare)
    assert [p.label for p in piles] == [0] and piles[0].given
    assert "its frequency given" in piles[0].line()


def test_small_classes_are_no_pile_and_abstentions_are_not_counted():
    # 10 of 40 labels in one class of 10 is 2.5× an even share, but too few to tell
    labels = _labels([10, 4, 3, 3, 3, 3, 3, 3, 4, 4])
    assert label_piles(labels, 10) == []
    assert [p.label for p in label_piles(labels, 10, min_count=5)] == [0]
    assert label_piles(np.full(50, -1), 10) == []
    with_abstained = np.concatenate([_labels([300] + [70] * 9), np.full(500, -1)])
    assert label_piles(with_abstained, 10)[0].share == pytest.approx(300 / 930)


def test_piles_are_named_largest_first():
    piles = label_piles(_labels([250, 300, 50, 50, 50, 50, 50, 50, 50, 100]), 10)
    assert [p.label for p in piles] == [1, 0]


def test_refine_names_a_pile_in_the_calibration_notes():
    from mrtf.refinery.trusted import with_piles_named
    from mrtf.trust.calibration import uncalibrated

    probs = np.full((400, 4), 0.1, np.float32)
    probs[np.arange(400), np.r_[np.zeros(250, int), np.arange(150) % 3 + 1]] = 0.7
    cal = with_piles_named(uncalibrated(probs), probs, None)
    assert any("pile onto class 0: 250 samples" in n for n in cal.notes)
    even = np.full((400, 4), 0.1, np.float32)
    even[np.arange(400), np.arange(400) % 4] = 0.7
    assert not any("pile" in n for n in with_piles_named(uncalibrated(even), even,
                                                         None).notes)
