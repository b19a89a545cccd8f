"""The paper's ensemble targets block by block: AvgLogit (Eq. 3), the stabilized softmax
(Eq. 6) and what the methods make of it (Eq. 7, Eq. 10). The logits are (K, M, C): an array,
or a spill read as one (spill.TeacherMajor); the same numbers either way."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch

from mrtf.compute.softmax_rows import stabilized_softmax, teacher_stds
from mrtf.device import off_cpu
from mrtf.refinery.config import REF_STD_BATCH, RefineConfig
from mrtf.refinery.registry import get_method
from mrtf.refinery.teachers import STD_BLOCK, _softmax_np, global_stds, stabilized_probs

TARGET_CHUNK = 16 * REF_STD_BATCH  # samples per block; a multiple of the reference std block


def stabilized_blocks(logits, config: RefineConfig, device: torch.device | None = None
                      ) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(start, q (K, m, C))`` of Eq. 6 block by block: the std is over all samples
    and classes (one global pass per teacher), the softmax per block, so memory stays at the
    (K, M, C) logits plus one block instead of several (K, M, C) float64 temporaries. Block
    s + 1 is read only after block s is yielded: a caller may write q over block s.
    ``device`` other than the CPU: the paper variant's arithmetic in torch there
    (compute.softmax_rows; numpy on the CPU)."""
    k_all, m = logits.shape[:2]
    dev = off_cpu(device)
    if config.variant == "paper" and dev is not None:
        stds = teacher_stds(logits, STD_BLOCK, dev)
        for s in range(0, m, TARGET_CHUNK):
            yield s, stabilized_softmax(logits[:, s:s + TARGET_CHUNK], config.tau, stds, dev)
        return
    if config.variant == "paper":
        stds = global_stds(logits)  # block-wise: the same numbers for a spilled array
        for s in range(0, m, TARGET_CHUNK):
            block = logits[:, s:s + TARGET_CHUNK]
            yield s, np.stack([_softmax_np(config.tau * block[k] / (stds[k] + 1e-8))
                               for k in range(k_all)])
        return
    for s in range(0, m, TARGET_CHUNK):  # per-batch std (reference code), no τ
        yield s, stabilized_probs(logits[:, s:s + TARGET_CHUNK], config.tau, "batch",
                                  REF_STD_BATCH)


def logit_targets(logits, num_local: int,
                  rule: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """(M, C) float32: ``rule`` of the local models' raw logits (k, m, C), block by block."""
    out = np.empty(logits.shape[1:], dtype=np.float32)
    for s in range(0, logits.shape[1], TARGET_CHUNK):
        out[s:s + TARGET_CHUNK] = rule(logits[:num_local, s:s + TARGET_CHUNK])
    return out


def stabilized_targets(logits, config: RefineConfig,
                       rule: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """(M, C) float32: ``rule`` of every teacher's stabilized softmax (K, m, C) (Eq. 6), block
    by block."""
    out = np.empty(logits.shape[1:], dtype=np.float32)
    for s, probs in stabilized_blocks(logits, config):
        out[s:s + probs.shape[1]] = rule(probs)
    return out


def ensemble_targets(logits, num_local: int, config: RefineConfig, u: float) -> np.ndarray:
    """The targets (M, C) float32 of a paper method (``config.method``: feddf Eq. 3, st
    Eq. 6-7, st+rd and mrtf Eq. 10, before CLR), block by block.

    logits (K, M, C): the ``num_local`` local models first, then θ_t and θ_{t+1} (or only
    θ_{t+1}, or the student) for self-teaching."""
    return get_method(config.method).ensemble(logits, num_local, config, u)
