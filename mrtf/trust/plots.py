"""``mrtf score --plot``: the reliability diagram (is the confidence what it says?) and the
risk-coverage curve (accuracy of the labels kept when the least confident are left out)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mrtf.io.atomic import atomic_path
from mrtf.trust.metrics import ece, reliability_bins
from mrtf.trust.selective import risk_coverage


def plot_trust(path: str | os.PathLike, confidence: np.ndarray, correct: np.ndarray,
               title: str = "", atomic: bool = True) -> Path:
    """One PNG, two panels: reliability diagram (15 bins) and risk-coverage curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conf = np.asarray(confidence, dtype=np.float64)
    ok = np.asarray(correct, dtype=bool)
    centers, acc, mean_conf, counts = reliability_bins(conf, ok)
    cov, kept_acc = risk_coverage(conf, ok)
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 4))
    try:
        a.plot([0, 1], [0, 1], ls="--", c="gray", lw=1)
        filled = counts > 0
        a.bar(centers[filled], acc[filled], width=1 / len(centers), edgecolor="k", alpha=0.7,
              label="accuracy")
        a.plot(mean_conf[filled], acc[filled], "o", c="C3", ms=3, label="mean confidence")
        a.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy",
              title=f"reliability (ECE {ece(conf, ok):.3f}, 15 bins)")
        a.legend(loc="upper left", fontsize=8)
        b.plot(cov, kept_acc, c="C0")
        b.axhline(ok.mean(), ls="--", c="gray", lw=1)
        b.set(xlim=(0, 1), ylim=(max(0.0, kept_acc.min() - 0.05), 1.0), xlabel="coverage",
              ylabel="accuracy of the kept labels", title="risk-coverage")
        if title:
            fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        out = Path(path)
        with atomic_path(out, atomic) as tmp:
            fig.savefig(tmp, format="png", dpi=90)
    finally:
        plt.close(fig)
    return out
