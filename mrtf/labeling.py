"""The label job as a library call: one (refined or received) model labels a dataset.

``mrtf label`` is this function plus file checks, locking and atomic writes; a notebook calls
it directly::

    from mrtf import H5Dataset, label
    from mrtf.io import load_bundle

    with H5Dataset("new.h5") as data:
        result = label(load_bundle("refined.safetensors"), data, coverage=0.8)
    result.labels.labels          # (M,) int64, -1 where the sample was left unlabeled
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import torch

from mrtf.errors import InputError
from mrtf.io.bundles import ReceivedModel
from mrtf.io.fits import check_model_fits
from mrtf.io.hdf5 import ArraySource, H5Dataset
from mrtf.io.labels import LabelSet
from mrtf.io.reading import Reading, ReadSource, is_image_shape
from mrtf.refinery import predict_probs
from mrtf.trust.calibration import Calibration, uncalibrated
from mrtf.trust.selective import Selection, check_selection, select


@dataclass(frozen=True)
class LabelResult:
    """What :func:`label` returns.

    Attributes:
        probs: (M, C) float32 softmax of the model on every sample.
        labels: the labels as written to a labels file: argmax of ``probs``, -1 where the
            sample was left unlabeled, with ids, confidence and the ``calibration`` record.
        calibration: the confidence of each label and the label-free accuracy estimate
            (the model's max probability, at the temperature its bundle carries if any).
        selection: which samples were left unlabeled, or None without
            ``min_confidence``/``coverage``.
    """

    probs: np.ndarray
    labels: LabelSet
    calibration: Calibration
    selection: Selection | None


def carried_temperature(model: ReceivedModel) -> float | None:
    """The calibration temperature a refined model carries (``mrtf.calibration``), or None.
    The value comes from an untrusted file: anything but a finite number in [0.01, 1000] is
    ignored."""
    raw = model.meta.extra.get("mrtf.calibration")
    if raw is None:
        return None
    try:
        t = float(json.loads(raw)["temperature"])
    except (TypeError, ValueError, KeyError):
        return None
    return t if math.isfinite(t) and 0.01 <= t <= 1000 else None


def carried_reading(model: ReceivedModel) -> Reading:
    """How a refined model reads its images (``mrtf.input_reading``, written when the
    refinery read the target another way: mrtf/refinery/input_reading.py), ``Reading()``
    (as given) without one. The value comes from an untrusted file: anything but a reading
    of bounded factor is refused."""
    raw = model.meta.extra.get("mrtf.input_reading")
    if raw is None:
        return Reading()
    try:
        return Reading.parse(raw)
    except ValueError as exc:
        raise InputError(f"{model.path.name}: mrtf.input_reading: {exc}") from None


def label(model: ReceivedModel, source: H5Dataset | ArraySource, *, batch_size: int = 1024,
          device: torch.device | str | None = None, min_confidence: float | None = None,
          coverage: float | None = None) -> LabelResult:
    """Label every sample of ``source`` with ``model`` (a bundle from
    :func:`mrtf.io.load_bundle`, e.g. the refined model ``mrtf refine`` wrote).

    ``min_confidence`` or ``coverage`` (not both) leave the least confident samples unlabeled
    (selective labeling). A model that carries ``mrtf.input_reading`` reads the images that
    way, as the refinery read its target (:func:`carried_reading`). Raises
    :class:`mrtf.errors.InputError` when the model does not fit the data, its reading is
    malformed or a selection value is out of range; ``source``'s ``y``, if any, is not read.
    """
    check_selection(min_confidence, coverage)
    reading = carried_reading(model)
    if not reading.as_given and not is_image_shape(tuple(source.sample_shape)):
        raise InputError(f"{model.path.name} reads images {reading.describe()} "
                         f"(mrtf.input_reading), but the data's samples are "
                         f"{tuple(source.sample_shape)}")
    net = model.build()
    check_model_fits(net, model.path.name, source, model.meta.num_classes,
                     model.meta.arch_kwargs)
    read = source if reading.as_given else ReadSource(source, reading)
    probs = predict_probs(net, read, batch_size, device)
    cal = uncalibrated(probs, carried_temperature(model))
    selection = select(cal.confidence, min_confidence, coverage)
    record = {**cal.attrs(), **({"selection": selection.to_dict()} if selection else {})}
    labels = LabelSet.from_probs(probs, source.ids(), cal.confidence,
                                 None if selection is None else selection.abstained, record)
    return LabelResult(probs, labels, cal, selection)
