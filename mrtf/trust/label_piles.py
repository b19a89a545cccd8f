"""Classes the labels pile onto, named after the estimate.

Models that cannot read part of a target dump it into one or two classes (MNIST → MNIST-M:
one class takes most of the errors). The estimate reads such a pile only as a lower spread
of the whole labelling (mrtf.trust.calibration), which lowers every sample's confidence
alike; it does not say where the wrong labels are. A class
that holds at least :data:`PILE_RATIO` times its expected share (an even share, or the
frequency the user gave: class_frequencies.py) is named, so that its labels can be checked
first or left out. The rule and its precision on the benchmarks:
docs/benchmarks/calibration.md, "Label piles".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: a class holding this many times its expected share of the labels is a pile
PILE_RATIO = 2.0
#: ... and at least this many labels (a small target's classes vary by chance)
MIN_PILE = 20


@dataclass(frozen=True)
class LabelPile:
    """Class ``label`` holds ``count`` of the labels, ``share`` of them, against an expected
    share ``expected`` (``given``: the user's class frequencies, else an even share)."""

    label: int
    count: int
    share: float
    expected: float
    given: bool = False

    def line(self) -> str:
        against = "its frequency given" if self.given else "an even share"
        return (f"the labels pile onto class {self.label}: {self.count} samples "
                f"({self.share:.1%}, {self.share / self.expected:.1f}× {against}); labels in "
                "such piles are mostly wrong (what the models could not read): check them "
                "first")


def label_piles(labels: np.ndarray, num_classes: int, prior: np.ndarray | None = None,
                ratio: float = PILE_RATIO, min_count: int = MIN_PILE) -> list[LabelPile]:
    """The classes whose share of ``labels`` (M,) is ≥ ``ratio`` × their expected share
    (``prior`` (C,), else 1/C) and that hold ≥ ``min_count`` labels, the largest first."""
    labels = np.asarray(labels)
    counts = np.bincount(labels[labels >= 0], minlength=num_classes)[:num_classes]
    total = int(counts.sum())
    if total == 0:
        return []
    expected = np.full(num_classes, 1.0 / num_classes) if prior is None else np.asarray(prior)
    share = counts / total
    piles = [LabelPile(int(c), int(counts[c]), float(share[c]), float(expected[c]),
                       prior is not None)
             for c in range(num_classes)
             if counts[c] >= min_count and share[c] >= ratio * expected[c]]
    return sorted(piles, key=lambda p: -p.count)
