"""State dicts and metadata as Flower records: tensors as ``ArrayRecord`` (numpy's .npy bytes,
loaded with ``allow_pickle=False``; no pickle anywhere), metadata as ``MetricRecord`` (counts,
loss, round) and ``ConfigRecord`` (settings). A received record is checked against what is
expected before its arrays are decoded (:mod:`.checks`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord

from mrtf.engines.flower.checks import (
    Expected,
    PartyRejected,
    check_declared,
    check_metrics,
    client_update,
)
from mrtf.federated.methods import ClientUpdate


def to_record(state: Mapping[str, torch.Tensor]) -> ArrayRecord:
    """A state dict as an ArrayRecord (CPU, contiguous; order kept)."""
    rec = ArrayRecord()
    for k, v in state.items():
        rec[k] = Array(np.ascontiguousarray(v.detach().cpu().numpy()))
    return rec


def decode(who: str, record: Any, expected: Mapping[str, torch.Tensor]
           ) -> dict[str, np.ndarray]:
    """An untrusted ArrayRecord's arrays, each checked (name, declared dtype/shape, payload
    size) before it is decoded; values are checked by :func:`.checks.check_state`."""
    if not isinstance(record, ArrayRecord):
        raise PartyRejected(f"{who}: sent no model (ArrayRecord 'arrays')")
    out: dict[str, np.ndarray] = {}
    for name, arr in record.items():
        if name not in expected:
            raise PartyRejected(f"{who}: its model has an unknown tensor {name!r} (not the "
                                "run's architecture)")
        check_declared(who, name, arr.dtype, arr.shape, len(arr.data), expected[name])
        try:
            out[name] = arr.numpy()
        except (ValueError, TypeError, OSError) as exc:
            raise PartyRejected(f"{who}: tensor {name!r} cannot be read ({exc})") from None
    return out


def from_record(who: str, record: Any, expected: Mapping[str, torch.Tensor]
                ) -> dict[str, torch.Tensor]:
    """A checked state dict from an untrusted ArrayRecord (the client's view of θ_t too)."""
    from mrtf.engines.flower.checks import check_state

    return check_state(who, decode(who, record, expected), expected)


def metrics_record(n_samples: int, label_counts: list[int], train_loss: float, rnd: int
                   ) -> MetricRecord:
    """A party's report: sample and label counts, mean local loss, the round (1-based)."""
    return MetricRecord({"n_samples": int(n_samples),
                         "label_counts": [int(c) for c in label_counts],
                         "train_loss": float(train_loss), "round": int(rnd) + 1})


def reply_update(who: str, party: int, reply: Message, expected: Expected) -> ClientUpdate:
    """A train reply as a checked ClientUpdate, or PartyRejected naming the party."""
    if reply.has_error():
        raise PartyRejected(f"{who}: failed: {error_reason(reply.error.reason)}")
    content = reply.content
    metrics = content.metric_records.get("metrics")
    if metrics is None:
        raise PartyRejected(f"{who}: sent no metrics (MetricRecord 'metrics')")
    # the metadata first: a wrong class count is named as such, not as a tensor's shape
    check_metrics(who, dict(metrics), expected.num_classes, expected.round)
    arrays = decode(who, content.array_records.get("arrays"), expected.state)
    return client_update(who, party, arrays, dict(metrics), expected)


def error_reason(text: str) -> str:
    """Flower's error reason ("<class 'mrtf.errors.InputError'>:<'...'>") as one line."""
    text = " ".join(str(text).split())
    if text.startswith("<class ") and ":<" in text:
        text = text.split(":<", 1)[1].rstrip(">").strip("'\"")
    return text[:300]
