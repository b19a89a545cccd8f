"""A received ONNX classifier as a teacher: run by onnxruntime, none of the party's code.

The graph was checked before a session is made (mrtf/io/onnx_files.py: standard operators
only, no control flow, bounded initializers). This module only runs it: ``forward(x)`` gives
logits (B, C) for a float batch, so the refinery treats it like any other teacher (Eq. 3-7
need logits only). An ONNX model that outputs probabilities (scikit-learn through skl2onnx)
gives their logarithm, whose softmax is the same distribution. When the graph has a features
output, ``forward_features`` gives it too; otherwise the student's features are used.

ONNX teachers have no parameters: they teach, they are never averaged or trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from mrtf.errors import InputError, first_line

#: outputs read as probabilities are floored here before the log (log 0 = -inf)
PROB_FLOOR = 1e-12


@dataclass(frozen=True)
class OnnxOutputs:
    """Which graph outputs mean what. ``scores``: the class scores (B, C); ``kind``:
    'logits' or 'probabilities'; ``features``: the penultimate representation, or None."""

    input_name: str
    scores: str
    kind: str
    features: str | None = None
    batch: int | None = None  # a fixed batch size the graph was exported with, else None
    rows_per_call: int = 1024  # samples per session call (its memory bound)


class OnnxTeacher(nn.Module):
    """``forward(x) -> logits (B, C)`` by an onnxruntime session on the CPU."""

    def __init__(self, session: Any, outputs: OnnxOutputs, num_classes: int, name: str) -> None:
        super().__init__()
        self.session, self.outputs = session, outputs
        self.num_classes, self.name = num_classes, name

    def __deepcopy__(self, memo: dict) -> OnnxTeacher:
        return self  # no parameters, no state: the session is only ever read

    def _run(self, x: torch.Tensor, names: list[str]) -> list[np.ndarray]:
        arr = np.ascontiguousarray(x.detach().to("cpu", torch.float32).numpy())
        step = self.outputs.batch or max(1, min(len(arr), self.outputs.rows_per_call))
        parts = []
        for s in range(0, len(arr), step):
            block = arr[s:s + step]
            short = step - len(block) if self.outputs.batch else 0
            if short:  # a graph exported with a fixed batch: pad the last block
                block = np.concatenate([block, np.repeat(block[-1:], short, 0)])
            try:
                got = self.session.run(names, {self.outputs.input_name: block})
            except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types
                raise InputError(f"{self.name}: onnxruntime failed on inputs of shape "
                                 f"{tuple(block.shape)} ({first_line(exc, 120)})") from None
            parts.append([np.asarray(g)[:len(g) - short] for g in got])
        return [np.concatenate([p[i] for p in parts]) for i in range(len(names))]

    def _scores(self, raw: np.ndarray, rows: int) -> torch.Tensor:
        if raw.ndim != 2 or raw.shape != (rows, self.num_classes):
            raise InputError(f"{self.name}: output {self.outputs.scores!r} has shape "
                             f"{raw.shape}, expected ({rows}, {self.num_classes})")
        raw = raw.astype(np.float32, copy=False)
        if self.outputs.kind == "probabilities":
            raw = np.log(np.maximum(raw, PROB_FLOOR))
        return torch.from_numpy(np.ascontiguousarray(raw))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (raw,) = self._run(x, [self.outputs.scores])
        return self._scores(raw, len(x)).to(x.device)


class OnnxTeacherWithFeatures(OnnxTeacher):
    """An ONNX teacher whose graph also outputs its features (named ``features``)."""

    def forward_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.outputs.features is not None
        raw, h = self._run(x, [self.outputs.scores, self.outputs.features])
        h = torch.from_numpy(np.ascontiguousarray(h.astype(np.float32, copy=False)))
        return h.flatten(1).to(x.device), self._scores(raw, len(x)).to(x.device)


def onnx_teacher(session: Any, outputs: OnnxOutputs, num_classes: int, name: str
                 ) -> OnnxTeacher:
    """The teacher module for a checked session; with ``forward_features`` when the graph has
    a features output."""
    cls = OnnxTeacher if outputs.features is None else OnnxTeacherWithFeatures
    return cls(session, outputs, num_classes, name).eval()
