"""Labels as CSV (``id,label,confidence``), for people who do not read HDF5."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from mrtf.io.atomic import atomic_path
from mrtf.io.labels import LabelSet


def write_labels_csv(path: str | os.PathLike, labels: LabelSet, atomic: bool = True) -> Path:
    """One row per sample: its id (the file name for an image folder; the row number when the
    data had no ids), the label and the model's confidence (max posterior).

    ``atomic=False``: ``path`` is already a temporary file (see :mod:`mrtf.io.outputs`)."""
    ids = labels.ids if labels.ids is not None else np.arange(len(labels.labels))
    conf = labels.confidence
    out = Path(path)
    with atomic_path(out, atomic) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "label", "confidence"])
        for i, lab, c in zip(ids.tolist(), labels.labels.tolist(), conf.tolist()):
            writer.writerow([i.decode() if isinstance(i, bytes) else i, lab, f"{c:.6f}"])
    return out
