"""Which target rows the reliability checks read: a seeded subset of at most
:data:`TRUST_SAMPLE` rows (``inspect --data`` and refine alike). The checks themselves run the
models, so they live in the refinery (mrtf.refinery.assess.assess_received)."""

from __future__ import annotations

import numpy as np

#: the reliability checks read at most this many target samples (a seeded random subset, in
#: file order), in ``inspect --data`` and in both refine paths alike, so that they give the
#: same verdicts at any size: the statistics are fractions and means over the target, whose
#: standard error at 20,000 samples is ≤ 0.0035 (a binomial at p = 0.5), far inside the
#: verdicts' margins (e.g. a relabelling agrees < 0.5 × its mapped agreement)
TRUST_SAMPLE = 20_000


def sample_rows(m: int, seed: int = 0, sample: int | None = None) -> np.ndarray | None:
    """Sorted rows of a seeded random subset of ``sample`` (default :data:`TRUST_SAMPLE`) of
    m target samples; None when m is not larger (every sample is read)."""
    sample = TRUST_SAMPLE if sample is None else sample
    if m <= sample:
        return None
    return np.sort(np.random.default_rng(seed).choice(m, size=sample, replace=False))


def sample_note(rows: np.ndarray, m: int, seed: int) -> str:
    return f"measured on {len(rows):,} of the {m:,} target samples (seed {seed})"
