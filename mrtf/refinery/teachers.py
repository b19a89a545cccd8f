"""Stabilized teachers (MrTF Sect. 4.1): teacher logits once, Eq. 3, 4, 6 and 7.

Teacher inference dominates the cost, so every teacher's logits on the whole target set are
computed exactly once, in ``torch.inference_mode``, streaming the target set in large chunks.
On CUDA each teacher runs in turn on big chunks (a stacked ``vmap`` pass is an option: it was
slower on an H100, :func:`resolve_stack`); on CPU, groups of zoo LeNet / ConvNet /
MLPNet teachers take the exact fast path of fastpath.py (cache-sized micro-batches,
channels-last, max-pool before ReLU: ~5x the plain loop, measured there), and groups of 2 or
more LeNets stacked.py (a compiled kernel that keeps both convolutions and pools of an image in
cache, where a C compiler and AVX-512 exist: 8.1-12.6x the loop at K = 50; else oneDNN:
6.4-8.0x; same argmax, logits within 1e-4 × their scale). Any other group falls back to a loop
over its models. Memory is the (K, M, C) output plus one chunk (and stacked.py's features of at
most 32 MiB of a chunk, or with oneDNN of one chunk, kept per thread): it does not
otherwise grow with M. :class:`TeacherChunks` yields the same outputs chunk by chunk (the
refinery's data pass, teach.py, writes them to its storage), reading the next chunk in a thread
meanwhile. On a loaded 2-core machine run it with 1 thread: the fast path's many small
parallel regions ran far slower with 2 (docs/benchmarks/scale.md).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import tqdm
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from mrtf.device import pick_device, release_pinned
from mrtf.errors import InputError
from mrtf.refinery.fastpath import PRECISIONS, fast_features, fast_forward
from mrtf.refinery.grouped import grouped_forward
from mrtf.refinery.placement import lent
from mrtf.refinery.precision import argmax_agreement, in_bf16
from mrtf.refinery.prefetch import host_chunks, on_device, prefetched
from mrtf.refinery.stacked import stacked_forward
from mrtf.trust.selection import select

STD_MODES = ("global", "batch")
STACK_MODES = ("auto", "fast", "grouped", "vmap", "nhwc", "loop")
#: rows per chunk on CUDA at least: at the CPU's 1,024 a 1M-row pass was ~1,000 chunks of
#: small kernels and per-chunk copies (docs/benchmarks/gpu.md)
CUDA_ROWS = 8192
# LeNet groups of at least this many take stacked.py (fp32): its oneDNN engine beat fastpath.py
# from K = 2 on (bench/results/teacher_compare-K10.json; its older GEMM engine needed 16)
STACKED_MIN = 2


@dataclass
class TeacherOutputs:
    """``logits`` (K, M, C) float32 in the order of the given models; ``features`` (M, D) float32
    of the model chosen with ``features_of`` (else None)."""

    logits: np.ndarray
    features: np.ndarray | None = None
    stacked_groups: int = 0
    looped_groups: int = 0
    fast_groups: int = 0


def arch_key(model: nn.Module) -> str:
    """Models with equal keys can be stacked: same class, same parameter/buffer names+shapes."""
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    return type(model).__qualname__ + json.dumps(shapes, sort_keys=True)


def group_by_arch(models: Sequence[nn.Module]) -> list[list[int]]:
    """Indices of ``models`` grouped by :func:`arch_key`, in first-seen order."""
    groups: dict[str, list[int]] = {}
    for i, m in enumerate(models):
        groups.setdefault(arch_key(m), []).append(i)
    return list(groups.values())


def _stacked_forward(models: Sequence[nn.Module]) -> Callable[[torch.Tensor], torch.Tensor]:
    """One function ``x (B, ...) -> logits (G, B, C)`` that runs the G models together."""
    params, buffers = stack_module_state(list(models))
    base = copy.deepcopy(models[0]).to("meta")

    def one(p: dict, b: dict, x: torch.Tensor) -> torch.Tensor:
        return functional_call(base, (p, b), (x,))

    batched = vmap(one, in_dims=(0, 0, None))
    return lambda x: batched(params, buffers, x)


def _looped_forward(models: Sequence[nn.Module], channels_last: bool = False
                    ) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> (G, B, C)`` by a loop; ``channels_last`` runs 4-D inputs in NHWC (on CPU, the
    ReLU/max-pool of small conv nets is ~2x faster in NHWC, measured on 2 cores)."""
    if not channels_last:
        return lambda x: torch.stack([m(x) for m in models])
    nhwc = [copy.deepcopy(m).to(memory_format=torch.channels_last) for m in models]

    def run(x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last)
        return torch.stack([m(x) for m in nhwc])

    return run


def resolve_stack(stack: str | bool, device: torch.device) -> str:
    """'auto' → 'fast' on CPU (stacked.py for ≥ 2 LeNets, else fastpath.py), 'grouped' on
    CUDA (grouped.py: groups of ≥ 2 zoo LeNets as one grouped network, every other group
    looped; docs/benchmarks/scale.md and gpu.md have the rates). 'fast' on CUDA is 'grouped'
    too: fastpath.py and stacked.py are CPU kernels. True → 'vmap', False → 'loop'."""
    if stack is True or stack is False:
        return "vmap" if stack else "loop"
    if stack not in STACK_MODES:
        raise ValueError(f"stack must be one of {STACK_MODES}, got {stack!r}")
    if stack in ("auto", "fast"):
        return "grouped" if device.type == "cuda" else "fast"
    return stack


def _group_forwards(models: Sequence[nn.Module], mode: str, probe: torch.Tensor,
                    precision: str = "fp32") -> list[tuple[list[int], Callable, str]]:
    """Per architecture group: (indices, forward, kind) with kind 'stacked', 'fast' or 'loop'.
    With mode 'vmap' the stacked forward is tried on ``probe`` and must agree with the first
    model's own forward; mode 'fast' takes fastpath.py where it is eligible and agrees on
    ``probe`` (stacked.py first for fp32 groups of ≥ STACKED_MIN LeNets; else a channels-last
    loop); otherwise the group is looped."""
    out = []
    nhwc = mode in ("nhwc", "fast") and probe.dim() == 4
    for idx in group_by_arch(models):
        group = [models[i] for i in idx]
        fwd, kind = _looped_forward(group, nhwc), "loop"
        fast = None
        if mode == "fast" and precision == "fp32" and len(group) >= STACKED_MIN:
            fast = stacked_forward(group, probe)  # LeNets: one conv for all first convs
        if mode == "fast" and fast is None:
            fast = fast_forward(group, probe, precision)
        if fast is not None:
            fwd, kind = fast, "fast"
        grouped = grouped_forward(group, probe) if mode == "grouped" else None
        if grouped is not None:
            fwd, kind = grouped, "grouped"
        if mode == "vmap" and len(group) > 1:
            try:
                cand = _stacked_forward(group)
                if torch.allclose(cand(probe)[0], group[0](probe), rtol=1e-4, atol=1e-4):
                    fwd, kind = cand, "stacked"
            except Exception:  # noqa: BLE001 - any vmap failure means: loop instead
                pass
        if precision == "bf16" and kind != "fast":  # a fast group made its own bf16 copies
            fwd = in_bf16(fwd, probe.device.type)
        out.append((idx, fwd, kind))
    return out


def teacher_logits(models: Sequence[nn.Module], source, batch_size: int = 1024,
                   device: torch.device | str | None = None,
                   features_of: nn.Module | None = None, stack: str | bool = "auto",
                   progress: bool = False, precision: str = "fp32") -> TeacherOutputs:
    """Every teacher's logits on the whole target set, computed once.

    Parameters
    ----------
    models : K eval-mode modules (any mix of architectures; each group is stacked).
    source : H5Dataset or ArraySource, read in chunks of ``batch_size`` rows; ``y`` is never read.
    features_of : optional module whose features (``forward_features``) are also kept, e.g.
        θ_{t+1} for the clustered label refinery (Eq. 11-12).
    stack : 'fast', 'grouped', 'vmap', 'nhwc', 'loop' or 'auto' (:func:`resolve_stack`).
    progress : show a progress bar over the target samples.
    precision : 'fp32' (default) or 'bf16': the teachers run in bfloat16 (precision.py; a
        fast-path group with its own bf16 copies, every other under autocast).

    Returns logits (K, M, C) float32 (and features (M, D) float32). The refinery's data pass
    (teach.py) consumes :class:`TeacherChunks` instead and may spill them (storage.py).
    """
    m_total = len(source)
    logits: np.ndarray | None = None
    feats: np.ndarray | None = None
    chunks = TeacherChunks(models, source, batch_size, device, features_of, stack, progress,
                           precision)
    for start, lg, h in chunks:
        if logits is None:
            logits = np.empty((len(models), m_total, lg.shape[-1]), dtype=np.float32)
        logits[:, start:start + lg.shape[1]] = lg
        if h is not None:
            if feats is None:
                feats = np.empty((m_total, h.shape[1]), dtype=np.float32)
            feats[start:start + len(h)] = h
    assert logits is not None
    kinds = chunks.kinds
    return TeacherOutputs(logits, feats, kinds.count("stacked"), kinds.count("loop"),
                          kinds.count("fast"))


class TeacherChunks:
    """Iterate ``(start, logits (K, m, C) float32, features (m, D) float32 or None)`` over the
    target set in chunks of ``batch_size`` rows (arguments as :func:`teacher_logits`). The
    next chunk is read from the source in a thread while the teachers run on this one
    (:func:`prefetched`). ``kinds`` lists each architecture group's path after the first chunk.
    The models are on the device in eval mode while it iterates, and back where they were, in
    their own modes, when it ends (placement.py).
    """

    def __init__(self, models: Sequence[nn.Module], source, batch_size: int = 1024,
                 device: torch.device | str | None = None,
                 features_of: nn.Module | None = None, stack: str | bool = "auto",
                 progress: bool = False, precision: str = "fp32") -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self.dev = pick_device(device)
        self.mode = resolve_stack(stack, self.dev)
        if self.dev.type == "cuda":  # per-sample outputs: the chunking does not change them
            batch_size = max(batch_size, CUDA_ROWS)
        # the caller's modules are moved to the device only while iterating (placement.py)
        self.models = list(models)
        self.source, self.batch_size, self.precision = source, batch_size, precision
        self.features_of = features_of
        self.progress = progress
        self.kinds: list[str] = []
        self.agreement: tuple[float, int] | None = None  # bf16: vs fp32 on the first chunk

    def __iter__(self):
        try:  # finally: this pass's pinned chunks go back, whether it ended or was left early
            with lent([*self.models, self.features_of], self.dev):
                yield from self._chunks()
        finally:
            release_pinned(self.dev)

    def _chunks(self):
        forwards = None
        # tqdm.tqdm looked up now: mrtf.progress.log_lines swaps it for plain log lines
        bar = tqdm.tqdm(total=len(self.source), desc=f"teachers ×{len(self.models)}",
                   unit="sample", leave=False, disable=not self.progress)
        with bar:
            for start, chunk in prefetched(host_chunks(self.source, self.batch_size,
                                                         self.dev)):
                bar.update(len(chunk))
                with torch.inference_mode():
                    x = on_device(chunk, self.dev)
                    if forwards is None:
                        forwards, fused = self._forwards(x[:8])
                    parts = _run(forwards, x)
                    if self.precision == "bf16" and self.agreement is None:
                        fp32, _ = self._forwards(x[:8], "fp32")
                        self.agreement = (argmax_agreement(parts, _run(fp32, x)), len(x))
                    h = None
                    if fused is not None:  # θ_{t+1}: features and logits in one pass
                        h_t, lg_t = fused[1](x)
                        h = h_t.float().cpu().numpy()
                        if fused[0] is not None:
                            parts[fused[0]] = lg_t.float().cpu().numpy()
                    elif self.features_of is not None:
                        h = self.features_of.forward_features(x)[0].flatten(1)
                        h = h.float().cpu().numpy()
                    lg = np.stack([parts[i] for i in range(len(self.models))]) if parts \
                        else np.empty((0, len(x), 0), np.float32)
                yield start, lg, h

    def _forwards(self, probe: torch.Tensor, precision: str | None = None):
        """The group forwards (in ``precision``, default the iterator's), and (index of
        features_of among the models or None, its fused features + logits forward) when
        features_of takes the fast path (fp32 only)."""
        precision = precision or self.precision
        fused = None
        if self.features_of is not None and self.mode == "fast" and precision == "fp32":
            run = fast_features(self.features_of, probe)
            if run is not None:
                at = next((i for i, m in enumerate(self.models) if m is self.features_of),
                          None)
                fused = (at, run)
        rest = [i for i in range(len(self.models)) if fused is None or i != fused[0]]
        forwards = [([rest[j] for j in idx], fwd, kind) for idx, fwd, kind in
                    _group_forwards([self.models[i] for i in rest], self.mode, probe,
                                    precision)]
        if precision == self.precision:
            self.kinds = [k for _, _, k in forwards]
        return forwards, fused


def _run(forwards: list, x: torch.Tensor) -> dict[int, np.ndarray]:
    """Teacher index → its logits (m, C) float32 on the host."""
    parts: dict[int, np.ndarray] = {}
    for idx, fwd, _ in forwards:
        out = fwd(x).float().cpu().numpy()
        parts.update({i: out[j] for j, i in enumerate(idx)})
    return parts


#: rows per block of :func:`global_stds` (a fixed block: the float64 sums, and so Eq. 6's
#: std, are the same whether the logits are in memory or spilled to disk)
STD_BLOCK = 65_536


def global_stds(logits, block: int | None = None) -> np.ndarray:
    """Eq. 6's std_k for each teacher: population std of its logits over all M samples and
    all C classes, exact two-pass in float64 over row blocks. ``logits`` is (K, M, C): an
    ndarray, or anything that returns ``logits[:, s:e]`` blocks (spill.TeacherMajor).
    Memory: one block, not a float64 copy of a teacher's (M, C) logits."""
    k, m, c = logits.shape
    block = block or STD_BLOCK
    sums = np.zeros(k)
    for s in range(0, m, block):
        lg = logits[:, s:s + block]
        sums += [np.ascontiguousarray(lg[i], dtype=np.float64).sum() for i in range(k)]
    mean = sums / (m * c)
    sq = np.zeros(k)
    for s in range(0, m, block):
        lg = logits[:, s:s + block]
        sq += [np.square(np.ascontiguousarray(lg[i], dtype=np.float64) - mean[i]).sum()
               for i in range(k)]
    return np.sqrt(sq / (m * c))


def _softmax_np(z: np.ndarray) -> np.ndarray:
    """Row softmax over the last axis, float32, computed in float64."""
    z = z.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def stabilized_probs(logits: np.ndarray, tau: float = 4.0, std: str = "global",
                     batch: int = 512, eps: float = 1e-8) -> np.ndarray:
    """Eq. 6: q_k = softmax(τ · f_k / std_k), (K, M, C) or (M, C) → same shape, float32.

    ``std='global'`` (paper): std_k is the population standard deviation of all logits of
    teacher k over all M samples and all C classes. ``std='batch'`` (reference code): std over
    each block of ``batch`` consecutive samples (its inference batch), and no τ (τ = 1).
    """
    if std not in STD_MODES:
        raise ValueError(f"std must be one of {STD_MODES}, got {std!r}")
    squeeze = logits.ndim == 2
    lg = logits[None] if squeeze else logits
    out = np.empty(lg.shape, dtype=np.float32)
    for k in range(lg.shape[0]):  # one teacher at a time: peak memory stays ~(M, C)
        if std == "global":
            out[k] = _softmax_np(tau * lg[k] / (lg[k].astype(np.float64).std() + eps))
            continue
        for s in range(0, lg.shape[1], batch):
            block = lg[k, s:s + batch]
            out[k, s:s + batch] = _softmax_np(block / (block.astype(np.float64).std() + eps))
    return out[0] if squeeze else out


def predict_probs(model: nn.Module, source, batch_size: int = 1024,
                  device: torch.device | str | None = None, stack: str = "loop"
                  ) -> np.ndarray:
    """σ(f(x)) of one model on the whole source, streamed, inference mode → (M, C) float32.
    ``stack`` as teacher_logits: refine passes its own ('auto': the CPU fast path, ~5x the
    loop for zoo conv nets), so the labels come from the path the teachers took."""
    out = teacher_logits([model], source, batch_size, device, stack=stack).logits[0]
    return _softmax_np(out)


def _weights(weights: Sequence[float] | np.ndarray | None, k: int) -> np.ndarray:
    w = np.full(k, 1.0 / k) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape[0] != k or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"need {k} non-negative weights with a positive sum")
    return w / w.sum(0, keepdims=True)


def avg_prob(probs: np.ndarray, weights: Sequence[float] | np.ndarray | None = None
             ) -> np.ndarray:
    """Eq. 4 / Eq. 7 (AvgProb): Σ_k w_k q_k, probs (K, M, C) → (M, C) float32.

    ``weights`` (K,) or per-sample (K, M); normalised to sum to 1 over k; None = uniform 1/K.
    """
    w = _weights(weights, probs.shape[0])
    w = np.broadcast_to(w[:, None], probs.shape[:2]) if w.ndim == 1 else w
    return np.einsum("km,kmc->mc", w, probs.astype(np.float64, copy=False)).astype(np.float32)


def avg_logit(logits: np.ndarray, weights: Sequence[float] | np.ndarray | None = None
              ) -> np.ndarray:
    """Eq. 3 (AvgLogit, FedDF Eq. 1): softmax(Σ_k w_k f_k), logits (K, M, C) → (M, C) float32."""
    w = _weights(weights, logits.shape[0])
    w = w[:, None, None] if w.ndim == 1 else w[:, :, None]
    return _softmax_np((w * logits.astype(np.float64)).sum(0))


def newest_locals(received) -> list:
    """S_t: the local models of the newest round, as mrtf.trust.selection decides it (round
    claims checked against the other files, copies counted once); without ``mrtf.round``
    every distinct local model counts."""
    return select(received).locals_


def newest_global(received):
    """θ_t: the chosen round's role-'global' model (the round's starting model) when its claim
    holds (mrtf.trust.selection), or None."""
    return select(received).start


def check_finite(logits: np.ndarray) -> None:
    """Refuse teacher outputs that overflowed: NaN targets would only surface later as a
    diverged distillation or a failed clustering, far from their cause."""
    bad = ~np.isfinite(logits).all(axis=(0, 2))
    if bad.any():
        raise InputError(f"the received models' outputs are not finite on {int(bad.sum())} of "
                         f"{len(bad)} target samples (their weights or the data overflow "
                         "float32); rescale the data or check the models")
