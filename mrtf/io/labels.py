"""Label files (README "Formats"): the labels a refinement or ``mrtf label`` writes, with their
probabilities, confidence, ids, abstained mask and calibration, written atomically."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import h5py
import numpy as np

import mrtf
from mrtf.errors import InputError
from mrtf.io.atomic import atomic_path
from mrtf.io.h5checks import check_ids_header, read_ids, root_dataset
from mrtf.io.hdf5 import _open, _reading, write_ids
from mrtf.io.limits import (
    MAX_CLASSES,
    check_memory,
)


@dataclass
class LabelSet:
    """Labels for M samples: ``labels`` (M,), ``probs`` (M, C), derived confidence/entropy."""

    labels: np.ndarray
    probs: np.ndarray
    ids: np.ndarray | None = None
    attrs: dict[str, Any] | None = None
    #: calibrated confidence (M,) of each label (mrtf.trust.calibration); None: max(probs)
    calibrated: np.ndarray | None = None
    #: (M,) bool, True where the sample was left unlabeled (label -1; mrtf.trust.selective)
    abstained: np.ndarray | None = None
    #: how the confidence was calibrated (written as the ``calibration`` attribute, JSON)
    calibration: dict[str, Any] | None = None

    @classmethod
    def from_probs(cls, probs: np.ndarray, ids: np.ndarray | None = None,
                   confidence: np.ndarray | None = None,
                   abstained: np.ndarray | None = None,
                   calibration: dict[str, Any] | None = None) -> LabelSet:
        """Labels = argmax(probs); -1 where ``abstained``."""
        probs = np.asarray(probs, dtype=np.float32)
        labels = probs.argmax(1).astype(np.int64)
        if abstained is not None:
            abstained = np.asarray(abstained, dtype=bool)
            labels[abstained] = -1
        conf = None if confidence is None else np.asarray(confidence, dtype=np.float32)
        return cls(labels=labels, probs=probs, ids=ids, calibrated=conf, abstained=abstained,
                   calibration=calibration)

    @property
    def confidence(self) -> np.ndarray:
        return self.probs.max(1) if self.calibrated is None else self.calibrated

    @property
    def entropy(self) -> np.ndarray:
        p = np.clip(self.probs, 1e-12, 1.0)
        return -(self.probs * np.log(p)).sum(1).astype(np.float32)


def write_labels(path: str | os.PathLike, labels: LabelSet, method: str,
                 config: dict[str, Any], parties: list[str], atomic: bool = True) -> Path:
    """Write a labels file atomically (temporary file beside the target, then rename).

    Non-finite probabilities (a model whose outputs overflow float32) are refused: they would
    make labels that mean nothing. ``atomic=False``: ``path`` is already a temporary file."""
    bad = sum(int((~np.isfinite(labels.probs[s:s + LABEL_BLOCK])).any(1).sum())
              for s in range(0, len(labels.probs), LABEL_BLOCK))
    if bad:
        raise InputError(f"the model's outputs are not finite for {bad} of {len(labels.probs)} "
                         "samples (its weights or the data overflow float32); no labels written")
    out = Path(path)
    with atomic_path(out, atomic) as tmp, h5py.File(tmp, "w") as f:
        _write_label_columns(f, labels)
        write_ids(f, labels.ids if labels.ids is not None else np.arange(len(labels.labels)))
        f.attrs["mrtf_version"] = mrtf.__version__
        f.attrs["method"] = method
        f.attrs["config"] = json.dumps(config, sort_keys=True, default=str)
        f.attrs["parties"] = json.dumps(parties)
        f.attrs["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        if labels.abstained is not None:  # label -1 marks these rows (selective labeling)
            f.create_dataset("abstained", data=labels.abstained.astype(np.uint8))
        if labels.calibration is not None:
            f.attrs["calibration"] = json.dumps(labels.calibration, sort_keys=True,
                                                default=float)
    return out


#: rows per block when a labels file is written: its temporaries (entropy, confidence) stay
#: a block's size however many samples there are
LABEL_BLOCK = 65_536


def _write_label_columns(f: h5py.File, labels: LabelSet) -> None:
    """labels, probs, confidence and entropy; the (M,) columns computed a block of rows at a
    time, so their (M, C) temporaries stay a block's size. (Each column is written whole, by
    ``create_dataset(data=...)``: an h5py dataset written by slices whose write failed (disk
    full) was kept alive by the traceback and crashed the interpreter at exit in a test.)"""
    m = len(labels.probs)
    conf = np.empty(m, dtype=np.float32)
    ent = np.empty(m, dtype=np.float32)
    for s in range(0, m, LABEL_BLOCK):
        cal = labels.calibrated  # the block's rows of every (M,) field, not the whole array
        part = replace(labels, labels=labels.labels[s:s + LABEL_BLOCK], ids=None,
                       probs=np.asarray(labels.probs[s:s + LABEL_BLOCK], dtype=np.float32),
                       calibrated=None if cal is None else cal[s:s + LABEL_BLOCK],
                       abstained=None)
        conf[s:s + len(part.probs)] = part.confidence
        ent[s:s + len(part.probs)] = part.entropy
    f.create_dataset("labels", data=labels.labels.astype(np.int64, copy=False))
    f.create_dataset("probs", data=np.asarray(labels.probs, dtype=np.float32))
    f.create_dataset("confidence", data=conf)
    f.create_dataset("entropy", data=ent)


def read_labels(path: str | os.PathLike) -> LabelSet:
    """Read a labels file written by :func:`write_labels`."""
    p = Path(path)
    with _open(p) as f:
        # every column a plain dataset of this file (no links, no external storage)
        found = {key: root_dataset(p, f, key)
                 for key in ("labels", "probs", "ids", "confidence", "abstained")}
        lab = found["labels"]
        if lab is None:
            raise InputError(f"{p}: has no dataset 'labels' (not an mrtf labels file)")
        if lab.ndim != 1 or lab.dtype.kind not in "iu" or lab.shape[0] == 0:
            raise InputError(f"{p}: 'labels' must be a non-empty 1-d integer array")
        if "probs" in f and (f["probs"].ndim != 2 or f["probs"].shape[0] != lab.shape[0]
                             or not 2 <= f["probs"].shape[1] <= MAX_CLASSES):
            raise InputError(f"{p}: 'probs' must be (M, C) with M = {lab.shape[0]} rows and "
                             f"2 <= C <= {MAX_CLASSES}, got {f['probs'].shape}")
        if "ids" in f:
            check_ids_header(p, f["ids"], lab.shape[0])
        declared = f["probs"].shape[1] if "probs" in f else 1
        check_memory(lab.shape[0] * (declared + 3) * 8, f"reading {p.name}")
        with _reading(p, "labels"):
            raw = lab[:]
            probs = f["probs"][:].astype(np.float32) if "probs" in f else None
            ids = read_ids(p, f["ids"]) if "ids" in f else None
            conf = _column(p, f, "confidence", lab.shape[0], np.float32)
            abst = _column(p, f, "abstained", lab.shape[0], bool)
        attrs = {k: (v.decode(errors="replace") if isinstance(v, bytes) else v)
                 for k, v in f.attrs.items()}
    c = probs.shape[1] if probs is not None else MAX_CLASSES
    if abst is not None:  # -1 is the label of an abstained row, and only of one
        if not np.array_equal(raw == -1, abst):
            raise InputError(f"{p}: 'abstained' does not match the rows labeled -1")
        raw = np.where(abst, 0, raw)
    if int(raw.min()) < 0 or int(raw.max()) >= c:
        raise InputError(f"{p}: 'labels' holds {int(raw.min())}..{int(raw.max())}, outside "
                         f"the classes 0..{c - 1}")
    labels = raw.astype(np.int64)
    if probs is None:
        check_memory(len(labels) * (int(labels.max()) + 1) * 4, f"expanding {p.name}")
        probs = np.eye(int(labels.max()) + 1, dtype=np.float32)[labels]
    if abst is not None:
        labels[abst] = -1
    calibration = None
    if "calibration" in attrs:
        try:
            calibration = json.loads(attrs["calibration"])
        except (TypeError, ValueError):
            raise InputError(f"{p}: attribute 'calibration' is not JSON") from None
    if conf is not None and not (np.isfinite(conf).all() and (conf >= 0).all()
                                 and (conf <= 1).all()):
        raise InputError(f"{p}: 'confidence' must hold values in [0, 1]")
    # an uncalibrated file's confidence is max(probs): keep it derived, as before
    return LabelSet(labels=labels, probs=probs, ids=ids, attrs=attrs,
                    calibrated=conf if calibration is not None else None, abstained=abst,
                    calibration=calibration)


def _column(p: Path, f, key: str, m: int, dtype) -> np.ndarray | None:
    """An optional (M,) column of a labels file, or None."""
    if key not in f:
        return None
    ds = f[key]
    if ds.ndim != 1 or ds.shape[0] != m or ds.dtype.kind not in "biuf":
        raise InputError(f"{p}: '{key}' must be a 1-d numeric array of {m} rows")
    return ds[:].astype(dtype)
