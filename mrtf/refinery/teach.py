"""The pipeline's data pass (stage 3): every teacher's logits on the target, and θ_{t+1}'s
features when the method keeps them, written into the run's storage chunk by chunk; θ_{t+1}'s
softmax before refinement, ``before``; non-finite outputs refused."""

from __future__ import annotations

import numpy as np

from mrtf.errors import InputError
from mrtf.refinery.state import RefineState
from mrtf.refinery.teachers import TeacherChunks, _softmax_np, predict_probs


def teach(state: RefineState) -> None:
    """``state.logits`` (storage.MemoryLogits / SpilledLogits), ``state.features`` and
    ``state.before``. The local models' logits of the reliability checks are reused when the
    storage keeps them (in memory, measured on the whole target); θ_{t+1}'s softmax is read
    off the last logits when it teaches, else it is predicted on its own."""
    config, source, storage = state.config, state.source, state.storage
    teachers, self_model = state.teachers, state.self_model
    if not teachers:
        state.before = predict_probs(self_model, source, config.inference_batch, state.dev)
        return
    done = 0
    trusted = state.trusted
    if storage.reuses_checked_logits and trusted is not None and trusted.logits is not None:
        done = len(trusted.logits)
    m = len(source)
    if done:
        state.logits = storage.logits(len(teachers), m, trusted.logits.shape[-1])
        state.logits.write(0, trusted.logits)
    before = _pass(state, teachers[done:], done) if len(teachers) > done else None
    state.before = before if before is not None else \
        predict_probs(self_model, source, config.inference_batch, state.dev)


def _pass(state: RefineState, models: list, first: int) -> np.ndarray | None:
    """Run ``models`` (teachers ``first``.. of ``state.teachers``) over the target into the
    storage; returns θ_{t+1}'s softmax when it is the last teacher, else None."""
    config, source, storage = state.config, state.source, state.storage
    m = len(source)
    self_model = state.self_model
    features_of = self_model if state.method.wants_features(state) else None
    self_last = models[-1] is self_model
    before = None
    bad = 0
    chunks = TeacherChunks(models, source, config.inference_batch, state.dev, features_of,
                           config.stack, config.progress, config.precision)
    for start, lg, h in chunks:
        if state.logits is None:
            state.logits = storage.logits(len(state.teachers), m, lg.shape[-1])
        if self_last and before is None:
            before = np.empty((m, lg.shape[-1]), dtype=np.float32)
        bad += int((~np.isfinite(lg).all(axis=(0, 2))).sum())
        state.logits.write(start, lg, first)
        if before is not None:
            before[start:start + lg.shape[1]] = _softmax_np(lg[-1])
        if h is not None:
            if state.features is None:
                state.features = storage.rows("features", m, h.shape[1])
            state.features[start:start + len(h)] = h
    if chunks.agreement is not None:
        agree, rows = chunks.agreement
        state.notes.append(f"teachers in bf16: their labels agree with fp32's on {agree:.2%} "
                           f"of (teacher, sample) pairs on the first {rows:,} samples")
    if bad:
        raise InputError(f"the received models' outputs are not finite on {bad} of {m} "
                         "target samples (their weights or the data overflow float32); "
                         "rescale the data or check the models")
    return before
