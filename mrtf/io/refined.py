"""What a refined (or fused) model is made from and what it says about itself: a fresh student
for a received set, and the bundle metadata that lets the result be received again."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from mrtf.averaging import average_received
from mrtf.errors import InputError
from mrtf.io.bundles import BundleMeta, ReceivedModel, ReceivedSet
from mrtf.io.reading import Reading
from mrtf.models import build_model, image_kwargs, input_kwargs


def student_kwargs(rs: ReceivedSet, arch: str, shape: tuple[int, ...] | None) -> dict:
    """``arch``'s keyword arguments for samples of ``shape``: (C, H, W) images or (D,) feature
    vectors; without data, the image shape of a received image model."""
    if shape is None:  # data-free: take the image shape from a received image model
        kw = next((m.meta.arch_kwargs for m in rs.models
                   if "in_channels" in m.meta.arch_kwargs), None)
        if kw is None:
            raise InputError("cannot tell the image shape for --student-arch without --data")
        return image_kwargs(arch, kw["in_channels"], kw["image_size"])
    return input_kwargs(arch, shape)


def new_student(rs: ReceivedSet, arch: str, seed: int, shape: tuple[int, ...] | None
                ) -> tuple[nn.Module, BundleMeta]:
    """A freshly initialised ``arch`` student for ``rs``'s classes, seeded by ``seed`` (the same
    seed gives the same initial weights), with its bundle metadata."""
    kwargs = student_kwargs(rs, arch, shape)
    torch.manual_seed(seed)
    model = build_model(arch, rs.num_classes, **kwargs)
    return model, BundleMeta(arch=arch, num_classes=rs.num_classes, arch_kwargs=kwargs)


def student_of_onnx_set(locals_: Sequence[ReceivedModel]
                        ) -> tuple[nn.Module, BundleMeta, str] | None:
    """(student, its metadata, a note) when some of the local parties that teach (S_t, as
    mrtf.trust.selection chooses them: the caller's ``locals_``) sent ONNX graphs, which only
    teach (they are not trainable here): the parameter average of the PyTorch parties when
    they share one architecture. None when no party sent ONNX; InputError when none of the
    PyTorch parties can start the student (the user gives --student-arch or --student)."""
    if not any(m.onnx for m in locals_):
        return None
    torch_parties = [m for m in locals_ if m.onnx is None]
    archs = {(m.meta.arch, json.dumps(m.meta.arch_kwargs, sort_keys=True))
             for m in torch_parties}
    if len(archs) != 1:
        why = ("every party sent ONNX" if not torch_parties
               else "the PyTorch parties differ in architecture")
        raise InputError(f"ONNX models teach but cannot be trained here and {why}: give the "
                         "model to refine with --student-arch ARCH (a built-in name or your "
                         "own module:factory) or --student FILE")
    model, _ = average_received(torch_parties)
    n_onnx = len(locals_) - len(torch_parties)
    teach = "party teaches" if n_onnx == 1 else "parties teach"
    note = (f"the student starts from the parameter average of the {len(torch_parties)} "
            f"PyTorch parties; the {n_onnx} ONNX {teach}")
    return model, torch_parties[0].meta, note


def refined_meta(rs: ReceivedSet, student_meta: BundleMeta | None, method: str,
                 config: dict[str, Any], calibration: Any = None,
                 reading: Reading | None = None) -> BundleMeta:
    """Bundle metadata of the refined model (so it can be received again): the student's
    architecture (else the received local models'), the summed label counts, the newest
    round it refines, the method and its config. ``calibration`` (mrtf.trust.calibration):
    its temperature and the estimate, for ``mrtf label`` (``mrtf.calibration``).
    ``reading``: how the refinery read the target's images, when not as given
    (``mrtf.input_reading``: ``mrtf label`` reads new data the same way)."""
    extra = {"mrtf.method": method,
             "mrtf.config": json.dumps(config, sort_keys=True, default=str)}
    if calibration is not None:
        extra["mrtf.calibration"] = json.dumps(
            {"temperature": calibration.temperature,
             "estimated_accuracy": calibration.estimated_accuracy,
             "plus_minus": calibration.plus_minus}, sort_keys=True)
    if reading is not None and not reading.as_given:
        extra["mrtf.input_reading"] = reading.spec()
    base = student_meta or rs.by_role("local")[0].meta
    counts = [m.meta.label_counts for m in rs.by_role("local")]
    total = (np.sum(counts, axis=0).astype(int).tolist()
             if all(c is not None for c in counts) else None)
    rounds = [m.meta.round for m in rs.models if m.meta.round is not None]
    return BundleMeta(arch=base.arch, num_classes=rs.num_classes, arch_kwargs=base.arch_kwargs,
                      party="refined", role="refined", label_counts=total,
                      round=max(rounds) if rounds else None,  # the round it refines
                      extra=extra)
