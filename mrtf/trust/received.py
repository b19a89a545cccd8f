"""Reliability of a received set on a target set: the models run once, then
:func:`mrtf.trust.reliability.assess` (what ``mrtf inspect RECEIVED --data`` shows)."""

from __future__ import annotations

import json

from mrtf.errors import InputError
from mrtf.trust.reliability import ReliabilityReport, assess


def assess_received(received, source, device=None, batch_size: int = 1024,
                    progress: bool = False) -> ReliabilityReport:
    """The newest round's local models of ``received`` (a ReceivedSet) measured on ``source``
    (H5Dataset or ArraySource; its ``y`` is never read)."""
    import numpy as np

    from mrtf.refinery.pipeline import newest_locals
    from mrtf.refinery.teachers import teacher_logits

    if len(source) == 0:
        raise InputError("the target set is empty (0 samples)")
    locals_r = newest_locals(received)
    if not locals_r:
        raise InputError("no received model has role 'local'; nothing to assess")
    out = teacher_logits([m.build("cpu") for m in locals_r], source, batch_size, device,
                         progress=progress)
    if not np.isfinite(out.logits).all():
        raise InputError("the received models' outputs are not finite on the target set "
                         "(their weights or the data overflow float32)")
    same = len({(m.meta.arch, json.dumps(m.meta.arch_kwargs, sort_keys=True))
                for m in locals_r}) == 1
    return assess([m.name for m in locals_r], out.logits,
                  [m.state_dict for m in locals_r] if same else None,
                  [m.meta.n_samples for m in locals_r], [m.meta.train_loss for m in locals_r])
