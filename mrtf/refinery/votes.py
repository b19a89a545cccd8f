"""The sources' stabilized softmax (Eq. 6) as the adaptive consensus' votes, where the storage
keeps them: whole in memory (:class:`MemoryProbs`, (S, M, C)) or in a spilled (M, S, C)
float32 array read by row blocks (:class:`SpilledProbs`). adaptive.py runs the same steps on
either; what differs is only where the numbers live and the order sums over M are added in.

Spilled, what is held: the posterior (M, C) float64, updated in place (one of the outputs'
size), one block of views, and the (C, A) sufficient statistics; what is read per EM step:
the spill, once (M · S · C · 4 bytes, served by the page cache when it fits).

Choice (issue 14): statistics chunk-wise over float32 per-sample probabilities on disk, not
float16: the views stay the exact float32 values the in-memory storage converts to float64,
so each block's arithmetic is the in-memory one; only the sums over M (Σ_x T(x, c) V(x, a),
Σ_x T(x, c)) are added in another order (a few ulp). Labels were identical on the tests'
few thousand samples (tests/test_streaming.py compares the two).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

import numpy as np
import torch

from mrtf.compute import lean_ops
from mrtf.device import off_cpu
from mrtf.refinery.cluster import _one_blas_thread, one_hot
from mrtf.refinery.consensus import (
    Consensus,
    MemoryVotes,
    Votes,
    confusion,
    confusions,
    em,
    statistics,
)
from mrtf.refinery.debias import debias, strength_of_counts, toward

BLOCK = 65_536  # rows per EM block: 65k × 12 sources × 10 classes × 8 B = 63 MB of views


class SourceStats:
    """What the consensus reads from each source's whole (M, C) softmax, accumulated block by
    block as the softmax is written: the running min and max (S, C) (dead sources) and,
    with ``class_bias`` (``class_prior`` "uniform" or "auto" only: ~0.6 s per 1M rows
    otherwise spent for nothing), the float64 sum (S, C) (its mean prediction, ``debias``)
    and its label counts (S, C) (``label_diversity``). ``device`` other than the CPU: each
    block is read there (torch; the min, max and counts exact, the sums in another order)."""

    def __init__(self, sources: int, classes: int, class_bias: bool = True,
                 device: torch.device | None = None) -> None:
        self.lo = np.full((sources, classes), np.inf, dtype=np.float32)
        self.hi = np.full((sources, classes), -np.inf, dtype=np.float32)
        self.class_bias = class_bias
        self.total = np.zeros((sources, classes))
        self.counts = np.zeros((sources, classes), dtype=np.int64)
        self.m = 0
        self.device = off_cpu(device)

    def add(self, q: np.ndarray) -> None:
        """One block q (S, m, C) of the sources' stabilized softmax."""
        if self.device is not None:
            self._add_on_device(torch.from_numpy(np.ascontiguousarray(q)).to(self.device))
            return
        self.lo, self.hi = np.minimum(self.lo, q.min(1)), np.maximum(self.hi, q.max(1))
        self.m += q.shape[1]
        if not self.class_bias:
            return
        self.total += q.sum(1, dtype=np.float64)
        c = q.shape[2]
        for i, pick in enumerate(q.argmax(2)):
            self.counts[i] += np.bincount(pick, minlength=c)

    def _add_on_device(self, q: torch.Tensor) -> None:
        self.lo = np.minimum(self.lo, q.amin(1).cpu().numpy())
        self.hi = np.maximum(self.hi, q.amax(1).cpu().numpy())
        self.m += q.shape[1]
        if not self.class_bias:
            return
        self.total += q.sum(1, dtype=torch.float64).cpu().numpy()
        # a one-hot sum, not bincount: deterministic on CUDA under reproducible_cuda
        hot = lean_ops.one_hot(q.argmax(2), q.shape[2])
        self.counts += hot.sum(1).cpu().numpy()


def live_sources(lo: np.ndarray, hi: np.ndarray, m: int, tol: float = 1e-6) -> list[int]:
    """adaptive.input_independent from the running min and max (S, C) of each source."""
    return [i for i in range(len(lo)) if not (m > 1 and float((hi[i] - lo[i]).max()) <= tol)]


class ModelVotes(Protocol):
    """The votes of one consensus (adaptive.measured_consensus) as its storage keeps them:
    ``votes()`` for the EM loop (consensus.Votes), ``start(nl)`` → (the normalised AvgProb of
    the first ``nl`` live sources (Eq. 7), its mean max: the bar EM must clear),
    ``fallback(log_likelihood)`` → the AvgProb itself as a Consensus, and
    ``with_clusters(assign, n)`` → the same votes plus the one-hot cluster view."""

    def votes(self) -> Votes: ...

    def start(self, nl: int, device: torch.device | None = None
              ) -> tuple[np.ndarray, float]: ...

    def fallback(self, log_likelihood: float) -> Consensus: ...

    def with_clusters(self, assign: np.ndarray, n: int) -> ModelVotes: ...


class MemoryModelVotes:
    """The live sources' (debiased) views, whole, and optionally the cluster view: the votes
    of one consensus in memory (a :class:`ModelVotes`)."""

    def __init__(self, models: list[np.ndarray], clusters: np.ndarray | None = None) -> None:
        self.models, self.cluster_view = models, clusters
        self.views = models + ([] if clusters is None else [clusters])
        self._init: np.ndarray | None = None

    def with_clusters(self, assign: np.ndarray, n: int) -> MemoryModelVotes:
        return MemoryModelVotes(self.models, one_hot(assign, n))

    def votes(self) -> MemoryVotes:
        return MemoryVotes(self.views)

    def start(self, nl: int, device: torch.device | None = None
              ) -> tuple[np.ndarray, float]:
        """The local models' AvgProb (all models' when none is local), normalised as EM
        starts, and its mean max (the bar EM must clear); numpy wherever the EM runs."""
        self._init = np.mean(self.models[:nl] if nl else self.models, axis=0)
        post = np.asarray(self._init, dtype=np.float64)
        return post / post.sum(1, keepdims=True), float(self._init.max(1).mean())

    def fallback(self, log_likelihood: float) -> Consensus:
        """The AvgProb itself, with the confusions it implies."""
        init = self._init
        assert init is not None, "start() first"
        return Consensus(init.astype(np.float64), init.sum(0) / init.sum(),
                         [confusion(init, v) for v in self.views], 0, log_likelihood)


class MemoryProbs:
    """The sources' stabilized softmax (S, M, C), whole in memory."""

    def __init__(self, probs: np.ndarray) -> None:
        self.probs = probs
        self.sources, self.m, self.classes = probs.shape

    def context(self) -> AbstractContextManager:
        return nullcontext()

    def model_votes(self, live: Sequence[int], strength: float, stats: SourceStats,
                    prior: np.ndarray | None = None) -> MemoryModelVotes:
        """The live sources' views, each source's class bias divided out with ``strength``
        (its mean prediction taken over the whole array; toward ``prior`` where given)."""
        return MemoryModelVotes([debias(self.probs[i], strength, prior=prior) for i in live])


class BlockViews:
    """A :class:`ModelVotes` on the spill, and its own consensus.Votes. The live sources'
    votes for a block of rows, read from the (M, S, C) spill: one
    (m, L·C) float64 matrix (L live sources side by side, so that each EM half is one GEMM
    for all of them), plus the cluster view's (M,) assignments (one-hot, A = ``clusters``).
    The models' evidence Σ_v λ_v V_v log π_vᵀ is one GEMM against their stacked
    λ_v log π_vᵀ (in memory the views are added one by one: the same terms, summed in another
    order); the cluster view's is a row gather (its votes are one-hot)."""

    def __init__(self, probs, live: Sequence[int], assign: np.ndarray | None = None,
                 clusters: int = 0, post: np.ndarray | None = None,
                 moved: dict | None = None) -> None:
        self.probs, self.live, self.assign, self.clusters = probs, list(live), assign, clusters
        self.post = post  # the posterior buffer (M, C) float64, shared by with_clusters
        self._nl = 0  # the local models among the live sources, as start() was told
        # device → the live sources' views there, shared by with_clusters: the spill is read
        # once for a consensus' start and both its EMs, not once for each (issue 36)
        self._moved: dict = {} if moved is None else moved

    def blocks(self, m: int) -> Iterable[tuple[int, int]]:
        return [(s, s + BLOCK) for s in range(0, m, BLOCK)]

    def raw(self, s: int, e: int) -> np.ndarray:
        """(m, S, C) float32 rows of the spill."""
        return self.probs[s:e]

    def read(self, s: int, e: int) -> tuple[np.ndarray, np.ndarray | None, int]:
        block = self.raw(s, e)
        if len(self.live) < block.shape[1]:  # (a copy; skipped when every source is live)
            block = block[:, self.live]
        votes = block.reshape(len(block), -1).astype(np.float64)
        if self.assign is None:
            return votes, None, s
        hot = np.zeros((len(block), self.clusters), dtype=np.float64)
        hot[np.arange(len(block)), self.assign[s:e]] = 1.0
        return votes, hot, s

    def evidence(self, log_prior: np.ndarray, pis: list[np.ndarray], weights: np.ndarray
                 ) -> Callable[[tuple], np.ndarray]:
        n = len(self.live)
        stacked = np.concatenate([lam * np.log(pi).T for pi, lam in zip(pis[:n], weights)])
        lp_hot = weights[n] * np.log(pis[n]).T if len(pis) > n else None

        def run(block: tuple) -> np.ndarray:
            votes, _, s = block
            log_t = log_prior + votes @ stacked
            if lp_hot is not None and weights[n]:
                log_t += lp_hot[self.assign[s:s + len(votes)]]
            return log_t
        return run

    def cross(self, t: np.ndarray, block: tuple) -> list[np.ndarray]:
        votes, hot, _ = block
        c = t.shape[1]
        both = t.T @ votes
        out = [both[:, i:i + c] for i in range(0, both.shape[1], c)]
        return out + ([t.T @ hot] if hot is not None else [])

    def on_device(self, device: torch.device) -> list[torch.Tensor]:
        """The live sources' views (M, C) float64 on ``device``, moved once (in their float32
        and widened there: exact), then the cluster view's one-hot made there."""
        if device not in self._moved:
            self._moved[device] = _views_to(self, torch.device(device))
        out = list(self._moved[device])
        if self.assign is not None:
            hot = lean_ops.one_hot(torch.from_numpy(self.assign).to(device), self.clusters)
            out.append(hot.to(torch.float64))
        return out

    def with_clusters(self, assign: np.ndarray, n: int) -> BlockViews:
        return BlockViews(self.probs, self.live, assign, n, self.post, self._moved)

    def votes(self) -> BlockViews:
        return self

    def start(self, nl: int, device: torch.device | None = None) -> tuple[np.ndarray, float]:
        m, c = self.probs.shape[0], self.probs.shape[2]
        if self.post is None:
            self.post = np.empty((m, c), dtype=np.float64)
        self._nl = nl
        dev = off_cpu(device)
        if dev is None:
            return self.post, _init(self, nl, m, self.post)
        views = self.on_device(dev)[:len(self.live)]
        return self.post, _init_from(views[:nl] if nl else views, self.post)

    def fallback(self, log_likelihood: float) -> Consensus:
        assert self.post is not None, "start() first"
        _init(self, self._nl, len(self.post), self.post, normalise=False)
        mass, cross = statistics(self, self.post)
        return Consensus(self.post, mass / mass.sum(), confusions(cross, 1.0), 0,
                         log_likelihood)


def _init(views: BlockViews, nl: int, m: int, post: np.ndarray, normalise: bool = True
          ) -> float:
    """post ← the local sources' AvgProb (Eq. 7), row-normalised as EM starts (or as it is,
    for the fall-back); returns its mean max (the bar EM must clear)."""
    top = 0.0
    use = views.live[:nl] if nl else views.live
    for s in range(0, m, BLOCK):
        block = views.raw(s, s + BLOCK)
        # a list averaged over axis 0, as MemoryModelVotes.start: the same float32 additions
        init = np.mean([block[:, i] for i in use], axis=0)
        top += float(init.max(1).astype(np.float64).sum())
        p = init.astype(np.float64)
        post[s:s + BLOCK] = p / p.sum(1, keepdims=True) if normalise else p
    return top / m


def _views_to(views: BlockViews, device: torch.device) -> list[torch.Tensor]:
    """The live sources' (M, C) float32 rows of the spill as float64 tensors on ``device``,
    read by blocks."""
    parts: list[list[torch.Tensor]] = [[] for _ in views.live]
    for s, e in views.blocks(views.probs.shape[0]):
        block = torch.from_numpy(np.ascontiguousarray(views.raw(s, e))).to(device)
        for j, i in enumerate(views.live):
            parts[j].append(block[:, i].to(torch.float64))
    return [torch.cat(p) for p in parts]


def _init_from(views: list[torch.Tensor], post: np.ndarray) -> float:
    """:func:`_init` from the sources' views on a device: the same float32 additions in the
    same order (the views hold float32 values), so post gets the same start up to the last
    bit of the row sums; returns the mean max."""
    acc = views[0].to(torch.float32)
    for v in views[1:]:
        acc += v.to(torch.float32)
    # a tensor divisor: CUDA divides by a Python scalar as a product with its reciprocal,
    # one float32 ulp from numpy's quotient
    init = acc / torch.full((), float(len(views)), dtype=torch.float32, device=acc.device)
    p = init.to(torch.float64)
    post[...] = (p / p.sum(1, keepdim=True)).cpu().numpy()
    return float(init.amax(1).to(torch.float64).sum()) / max(1, len(post))


def dawid_skene_blocks(views: BlockViews, post: np.ndarray, weights: Sequence[float],
                       iterations: int = 30, smoothing: float = 1.0, tol: float = 1e-6
                       ) -> Consensus:
    """consensus.dawid_skene over row blocks of the spill; ``post`` (M, C) float64 holds the
    normalised start and is updated in place (the returned Consensus' posterior)."""
    return em(views, post, weights, iterations, smoothing, tol)


class SpilledProbs:
    """The sources' stabilized softmax in a (M, S, C) float32 spill (spill.SpillArray), read
    by row blocks; the uniform class prior rewrites it in place."""

    def __init__(self, spill) -> None:
        self.probs = spill
        self.m, self.sources, self.classes = spill.shape

    def context(self) -> AbstractContextManager:
        """One BLAS thread: the EM's GEMMs are thin (65k × 10 by 10), and OpenBLAS's 2-thread
        pool on this loaded 2-core machine ran them at ~0.5 GFLOP/s (44 s for M = 100k)."""
        return _one_blas_thread()

    def model_votes(self, live: Sequence[int], strength: float, stats: SourceStats,
                    prior: np.ndarray | None = None) -> BlockViews:
        """The live sources' votes; with ``strength`` > 0 each one's class bias is first
        divided out in place with its whole-M mean from ``stats`` (toward ``prior`` where
        given; so the learned prior, which reads the spill as it is, runs first)."""
        if strength > 0:
            _debias_in_place(self.probs, stats, live, strength, prior)
        return BlockViews(self.probs, live)


def _debias_in_place(probs, stats: SourceStats, live: Sequence[int], strength: float,
                     prior: np.ndarray | None = None) -> None:
    """debias of every live source over the spill, on the device ``stats`` was read on."""
    assert stats.class_bias, "SourceStats(class_bias=True) gathers what debias needs"
    mean = toward(stats.total / max(1, stats.m), prior)
    for s in range(0, len(probs), BLOCK):
        block = probs[s:s + BLOCK]
        if stats.device is not None:
            block = _debiased_on(block, live, strength, mean, stats.device)
        else:
            for i in live:
                block[:, i] = debias(block[:, i], strength, mean[i])
        probs.write(s, block)


def _debiased_on(block: np.ndarray, live: Sequence[int], strength: float, mean: np.ndarray,
                 device: torch.device) -> np.ndarray:
    """debias.debias of the live sources of a block (n, S, C) on ``device``: the same
    float64 quotients (the divisor made on the host, as debias makes it), float32 out."""
    t = torch.from_numpy(np.ascontiguousarray(block)).to(device)
    # every source divided (the dead ones by 1) and the live ones' rows kept by a mask, not
    # written by index: CUDA's indexing kernels cost host memory (docs/gpu.md, "Host memory")
    den = np.ones((t.shape[1], t.shape[2]), np.float64)
    den[list(live)] = np.maximum(np.asarray(mean[list(live)], np.float64), 1e-8) ** strength
    r = t.to(torch.float64) / torch.from_numpy(den).to(device)
    is_live = torch.from_numpy(np.isin(np.arange(t.shape[1]), list(live))).to(device)
    out = torch.where(is_live[None, :, None], (r / r.sum(2, keepdim=True)).to(torch.float32), t)
    return out.cpu().numpy()


def debias_spill(probs, stats: SourceStats, live: Sequence[int]) -> float:
    """adaptive.debias of every live source, written over the (M, S, C) spill in place
    (the uniform class prior); returns the strength s (0: nothing written)."""
    if not live:
        return 0.0
    assert stats.class_bias, "SourceStats(class_bias=True) gathers what debias needs"
    strength = strength_of_counts(stats.counts, live)
    if strength <= 0:
        return 0.0
    _debias_in_place(probs, stats, live, strength)
    return strength
