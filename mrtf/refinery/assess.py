"""Reliability of a received set on a target set: the models run once, then
:func:`mrtf.trust.reliability.assess` (what ``mrtf inspect RECEIVED --data`` shows). Here, not
in mrtf.trust, because running the models is the refinery's (teachers.py): trust judges what
they output and imports nothing of the refinery."""

from __future__ import annotations

import json

import numpy as np

from mrtf.averaging import average_received
from mrtf.errors import InputError
from mrtf.io.hdf5 import RowSubset
from mrtf.refinery.teachers import newest_global, newest_locals, teacher_logits
from mrtf.trust.basin import SHARED_COSINE, assess_basin, weight_cosine
from mrtf.trust.received import sample_note, sample_rows
from mrtf.trust.reliability import ReliabilityReport, assess
from mrtf.trust.selection import select


def assess_received(received, source, device=None, batch_size: int = 1024,
                    progress: bool = False, seed: int = 0) -> ReliabilityReport:
    """The newest round's local models of ``received`` (a ReceivedSet) measured on ``source``
    (H5Dataset or ArraySource; its ``y`` is never read), or on :func:`sample_rows` of it."""
    if len(source) == 0:
        raise InputError("the target set is empty (0 samples)")
    locals_r = newest_locals(received)
    if not locals_r:
        raise InputError("no received model has role 'local'; nothing to assess")
    rows = sample_rows(len(source), seed)
    seen = source if rows is None else RowSubset(source, rows)
    out = teacher_logits([m.build("cpu") for m in locals_r], seen, batch_size, device,
                         progress=progress)
    if not np.isfinite(out.logits).all():
        raise InputError("the received models' outputs are not finite on the target set "
                         "(their weights or the data overflow float32)")
    same = len({(m.meta.arch, json.dumps(m.meta.arch_kwargs, sort_keys=True))
                for m in locals_r}) == 1 and not any(m.onnx for m in locals_r)
    states = [m.state_dict for m in locals_r] if same else None
    cosine = None if states is None else weight_cosine(states)
    shared = cosine is None or cosine >= SHARED_COSINE
    start = newest_global(received) if shared else None
    report = assess([m.name for m in locals_r], out.logits, states,
                    [m.meta.n_samples for m in locals_r], [m.meta.train_loss for m in locals_r],
                    None if start is None else start.state_dict, shared)
    keep = [i for i in range(len(locals_r)) if i not in report.excluded] or \
        list(range(len(locals_r)))
    basin = None
    if cosine is not None and len(keep) >= 2:  # as refine judges it: the kept parties' average
        avg = kept_average(locals_r, report, keep)
        basin = assess_basin(cosine, out.logits[keep],
                             teacher_logits([avg], seen, batch_size, device).logits[0])
        basin.best = keep[basin.best]  # an index among all the parties, as the report's
    if basin is not None:
        report.notes.insert(0, basin.line(locals_r[basin.best].name) if not
                            basin.average_works else basin.line())
    report.notes[:0] = [f"refused: {line}" for line in select(received).suspicious]
    if rows is not None:
        report.notes.append(sample_note(rows, len(source), seed))
    return report


def kept_average(locals_r: list, report: ReliabilityReport, keep: list[int]):
    """The parameter average refine would use: the parties not excluded, with the report's
    claim-checked (a refused n_samples counts as the median claim), verdict-scaled
    weights."""
    avg, _ = average_received([locals_r[i] for i in keep],
                              weights=[report.weights[i] or 1.0 for i in keep])
    return avg
