"""The adaptive method (adaptive.py) without its (S, M, C) arrays: Dawid-Skene EM whose
statistics are accumulated block by block over a spilled (M, S, C) float32 array of the
sources' stabilized softmax (Eq. 6).

What is held: the posterior (M, C) float64, updated in place (one of the outputs' size), one
block of views, and the (C, A) sufficient statistics. What is read per EM step: the spill,
once (M · S · C · 4 bytes, served by the page cache when it fits). One pass per EM step does
both halves: the E-step of a block uses the confusions of the previous M-step, and the
block's new posterior is added at once into the statistics of the next M-step, so the
posterior is never held twice.

Choice (issue 14): statistics chunk-wise over float32 per-sample probabilities on disk, not
float16: the views stay the exact float32 values the in-memory path converts to float64, so
each block's arithmetic is the in-memory one; only the sums over M (Σ_x T(x, c) V(x, a),
Σ_x T(x, c)) are added in another order (a few ulp). Labels were identical on the tests'
few thousand samples. This mirrors ``adaptive_targets`` and ``consensus.dawid_skene`` step by
step; a change there must be made here too (tests/test_streaming.py compares the two).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mrtf.refinery.adaptive import (
    DEBIAS_SCALE,
    AdaptiveTargets,
    Clusters,
    SourceTrust,
    cluster_weight,
    debias,
    histogram_diversity,
    keep_one,
    model_weights,
    priors_to_form,
    source_report,
)
from mrtf.refinery.cluster import _one_blas_thread, kmeans_assign
from mrtf.refinery.consensus import Consensus

BLOCK = 65_536  # rows per EM block: 65k × 12 sources × 10 classes × 8 B = 63 MB of views


class BlockViews:
    """The live sources' votes for a block of rows, read from the (M, S, C) spill: one
    (m, L·C) float64 matrix (L live sources side by side, so that each EM half is one GEMM
    for all of them), plus the cluster view's (M,) assignments (one-hot, A = ``clusters``)."""

    def __init__(self, probs, live: Sequence[int], assign: np.ndarray | None = None,
                 clusters: int = 0) -> None:
        self.probs, self.live, self.assign, self.clusters = probs, list(live), assign, clusters

    def raw(self, s: int, e: int) -> np.ndarray:
        """(m, S, C) float32 rows of the spill."""
        return self.probs[s:e]

    def read(self, s: int, e: int) -> tuple[np.ndarray, np.ndarray | None]:
        block = self.raw(s, e)
        if len(self.live) < block.shape[1]:  # (a copy; skipped when every source is live)
            block = block[:, self.live]
        votes = block.reshape(len(block), -1).astype(np.float64)
        if self.assign is None:
            return votes, None
        hot = np.zeros((len(block), self.clusters), dtype=np.float64)
        hot[np.arange(len(block)), self.assign[s:e]] = 1.0
        return votes, hot


def _init(views: BlockViews, nl: int, m: int, post: np.ndarray, normalise: bool = True
          ) -> float:
    """post ← the local sources' AvgProb (Eq. 7), row-normalised as dawid_skene starts (or as
    it is, for adaptive._consensus' fall-back); returns its mean max (the bar EM must
    clear)."""
    top = 0.0
    use = views.live[:nl] if nl else views.live
    for s in range(0, m, BLOCK):
        block = views.raw(s, s + BLOCK)
        # a list averaged over axis 0, as adaptive.py does: the same float32 additions
        init = np.mean([block[:, i] for i in use], axis=0)
        top += float(init.max(1).astype(np.float64).sum())
        p = init.astype(np.float64)
        post[s:s + BLOCK] = p / p.sum(1, keepdims=True) if normalise else p
    return top / m


def _cross(t: np.ndarray, votes: np.ndarray, hot: np.ndarray | None, c: int
           ) -> list[np.ndarray]:
    """Σ_x T(x, c) V_v(x, a) of one block for every view: [(C, A_v)]."""
    both = t.T @ votes
    out = [both[:, i:i + c] for i in range(0, both.shape[1], c)]
    return out + ([t.T @ hot] if hot is not None else [])


def _stats(views: BlockViews, post: np.ndarray, m: int) -> tuple[np.ndarray, list[np.ndarray]]:
    c = post.shape[1]
    mass = np.zeros(c)
    cross: list[np.ndarray] | None = None
    for s in range(0, m, BLOCK):
        t = post[s:s + BLOCK]
        mass += t.sum(0)
        parts = _cross(t, *views.read(s, s + BLOCK), c)
        cross = parts if cross is None else [a + b for a, b in zip(cross, parts)]
    assert cross is not None
    return mass, cross


def _confusions(cross: list[np.ndarray], smoothing: float) -> list[np.ndarray]:
    """consensus.confusion from accumulated Σ_x T(x, c) V(x, a)."""
    out = []
    for pv in cross:
        pi = pv + smoothing / pv.shape[1]
        out.append(pi / pi.sum(1, keepdims=True))
    return out


def dawid_skene_blocks(views: BlockViews, post: np.ndarray, weights: Sequence[float],
                       iterations: int = 30, smoothing: float = 1.0, tol: float = 1e-6
                       ) -> Consensus:
    """consensus.dawid_skene over row blocks; ``post`` (M, C) float64 holds the normalised
    start and is updated in place (the returned Consensus' posterior). The models' evidence
    Σ_v λ_v V_v log π_vᵀ is one GEMM against their stacked λ_v log π_vᵀ (the in-memory path
    adds the views one by one: the same terms, summed in another order); the cluster view's
    is a row gather (its votes are one-hot)."""
    m, c = post.shape
    w = np.asarray(weights, dtype=np.float64)
    nviews = len(views.live)
    mass, cross = _stats(views, post, m)
    pis: list[np.ndarray] = []
    done, loglik = 0, float("-inf")
    while done < iterations:
        done += 1
        prior = mass + 1e-6
        prior /= prior.sum()
        pis = _confusions(cross, smoothing)
        stacked = np.concatenate([lam * np.log(pi).T for pi, lam in zip(pis[:nviews], w)])
        lp_hot = w[nviews] * np.log(pis[nviews]).T if len(pis) > nviews else None
        mass, cross, moved, loglik = np.zeros_like(mass), [np.zeros_like(x) for x in cross], \
            0.0, 0.0
        for s in range(0, m, BLOCK):
            votes, hot = views.read(s, s + BLOCK)
            log_t = np.log(prior) + votes @ stacked
            if lp_hot is not None and w[nviews]:
                log_t += lp_hot[views.assign[s:s + BLOCK]]
            top = log_t.max(1, keepdims=True)
            log_t -= top
            new = np.exp(log_t)
            loglik += float((top[:, 0] + np.log(new.sum(1))).sum())
            new /= new.sum(1, keepdims=True)
            moved = max(moved, float(np.abs(new - post[s:s + BLOCK]).max()))
            post[s:s + BLOCK] = new
            mass += new.sum(0)
            cross = [a + b for a, b in zip(cross, _cross(new, votes, hot, c))]
        if moved < tol:
            break
    prior = mass + 1e-6
    return Consensus(post, prior / prior.sum(), pis, done, loglik)


def _consensus(views: BlockViews, nl: int, weights: Sequence[float], post: np.ndarray
               ) -> Consensus:
    """adaptive._consensus: EM from the AvgProb, kept only when surer than its start."""
    m = len(post)
    start = _init(views, nl, m, post)
    out = dawid_skene_blocks(views, post, weights)
    if float(post.max(1).mean()) >= start:
        return out
    _init(views, nl, m, post, normalise=False)  # the AvgProb itself, with the confusions it implies
    mass, cross = _stats(views, post, m)
    return Consensus(post, mass / mass.sum(), _confusions(cross, 1.0), 0, out.log_likelihood)


def live_sources(lo: np.ndarray, hi: np.ndarray, m: int, tol: float = 1e-6) -> list[int]:
    """adaptive.input_independent from the running min and max (S, C) of each source."""
    return [i for i in range(len(lo)) if not (m > 1 and float((hi[i] - lo[i]).max()) <= tol)]


class SourceStats:
    """What adaptive.py reads from each source's whole (M, C) softmax, accumulated block by
    block while the spill is written: the running min and max (S, C) (dead sources) and,
    with ``class_bias`` (``class_prior`` "uniform" or "auto" only: ~0.6 s per 1M rows
    otherwise spent for nothing), the float64 sum (S, C) (its mean prediction, ``debias``)
    and its label counts (S, C) (``label_diversity``)."""

    def __init__(self, sources: int, classes: int, class_bias: bool = True) -> None:
        self.lo = np.full((sources, classes), np.inf, dtype=np.float32)
        self.hi = np.full((sources, classes), -np.inf, dtype=np.float32)
        self.class_bias = class_bias
        self.total = np.zeros((sources, classes))
        self.counts = np.zeros((sources, classes), dtype=np.int64)
        self.m = 0

    def add(self, q: np.ndarray) -> None:
        """One block q (S, m, C) of the sources' stabilized softmax."""
        self.lo, self.hi = np.minimum(self.lo, q.min(1)), np.maximum(self.hi, q.max(1))
        self.m += q.shape[1]
        if not self.class_bias:
            return
        self.total += q.sum(1, dtype=np.float64)
        c = q.shape[2]
        for i, pick in enumerate(q.argmax(2)):
            self.counts[i] += np.bincount(pick, minlength=c)


def debias_spill(probs, stats: SourceStats, live: Sequence[int]) -> float:
    """adaptive.debias of every live source, written over the (M, S, C) spill in place
    (the uniform class prior); returns the strength s (0: nothing written)."""
    if not live:
        return 0.0
    assert stats.class_bias, "SourceStats(class_bias=True) gathers what debias needs"
    h = float(np.mean([histogram_diversity(stats.counts[i]) for i in live]))
    strength = float(min(1.0, h / DEBIAS_SCALE))
    if strength <= 0:
        return 0.0
    mean = stats.total / max(1, stats.m)
    for s in range(0, len(probs), BLOCK):
        block = probs[s:s + BLOCK]
        for i in live:
            block[:, i] = debias(block[:, i], strength, mean[i])
        probs.write(s, block)
    return strength


def adaptive_targets_blocks(probs, stats: SourceStats, names: Sequence[str],
                            self_probs: np.ndarray, features, seed: int = 0,
                            num_local: int | None = None, class_prior: str = "auto",
                            source_weights: Sequence[float] | None = None,
                            neighbours: np.ndarray | None = None) -> AdaptiveTargets:
    """adaptive.adaptive_targets on a (M, S, C) float32 spill ``probs`` (read by row slices,
    written in place by the uniform class prior), with each source's whole-M statistics
    ``stats``, and θ_{t+1}'s features (M, D) for the cluster view read the same way.
    ``class_prior``, ``source_weights`` and ``neighbours`` as adaptive_targets; "auto" runs
    the learned consensus first, keeps its targets, then debiases the spill for the uniform
    one (a second (M, C) float64 posterior while both exist).

    On one BLAS thread: the EM's GEMMs are thin (65k × 10 by 10), and OpenBLAS's 2-thread
    pool on this loaded 2-core machine ran them at ~0.5 GFLOP/s (44 s for M = 100k)."""
    with _one_blas_thread():
        m, s_all, c = probs.shape
        live = live_sources(stats.lo, stats.hi, m)
        dead = [SourceTrust(names[i], 0.0, None, "left out: the same output for every "
                            "sample (no information)") for i in range(s_all) if i not in live]
        if not live:
            return AdaptiveTargets(np.asarray(self_probs, np.float32), dead)
        clusters = Clusters(features, c, seed, kmeans_assign)
        # learned first: the uniform prior rewrites the spill
        return keep_one([_one_prior(probs, stats, names, live, dead, num_local, source_weights,
                                    clusters, prior)
                         for prior in priors_to_form(class_prior, neighbours)], neighbours)


def _one_prior(probs, stats: SourceStats, names: Sequence[str], live: list[int],
               dead: list[SourceTrust], num_local: int | None,
               source_weights: Sequence[float] | None, clusters: Clusters,
               class_prior: str) -> AdaptiveTargets:
    """adaptive._one_prior on the spill (the uniform prior rewrites it in place, so it runs
    after the learned one)."""
    m, s_all, c = probs.shape
    strength = debias_spill(probs, stats, live) if class_prior == "uniform" else 0.0
    nl, w_models = model_weights(live, s_all, num_local, source_weights)
    post = np.empty((m, c), dtype=np.float64)
    views = BlockViews(probs, live)
    final = models = _consensus(views, nl, w_models, post)
    conf = models.mean_max_posterior
    lam = cluster_weight(conf) if clusters.usable else 0.0
    if lam > 0:
        assign, n = clusters.get()
        final = _consensus(BlockViews(probs, live, assign, n), nl, w_models + [lam], post)
    sources = source_report(final, [names[i] for i in live], w_models, c, conf, lam,
                            clusters.features is not None)
    return AdaptiveTargets(final.posterior.astype(np.float32), sources + dead, conf, lam, final,
                           strength)
