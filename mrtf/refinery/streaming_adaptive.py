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
    SELF_WEIGHT,
    AdaptiveTargets,
    SourceTrust,
    _verdict,
    cluster_weight,
)
from mrtf.refinery.cluster import kmeans_assign
from mrtf.refinery.consensus import Consensus

BLOCK = 65_536  # rows per EM block: 65k × 12 sources × 10 classes × 8 B = 63 MB of views


class BlockViews:
    """The live sources' votes (float64, as dawid_skene converts them) for a block of rows,
    read from the (M, S, C) spill, plus the cluster view rebuilt one-hot from its (M,)
    assignments."""

    def __init__(self, probs, live: Sequence[int], assign: np.ndarray | None = None,
                 clusters: int = 0) -> None:
        self.probs, self.live, self.assign, self.clusters = probs, list(live), assign, clusters

    def __len__(self) -> int:
        return len(self.live) + (self.assign is not None)

    def read(self, s: int, e: int) -> list[np.ndarray]:
        block = self.probs[s:e]
        out = [np.ascontiguousarray(block[:, i], dtype=np.float64) for i in self.live]
        if self.assign is not None:
            hot = np.zeros((len(block), self.clusters), dtype=np.float64)
            hot[np.arange(len(block)), self.assign[s:e]] = 1.0
            out.append(hot)
        return out


def _init(views: BlockViews, nl: int, m: int, post: np.ndarray, normalise: bool = True
          ) -> float:
    """post ← the local sources' AvgProb (Eq. 7), row-normalised as dawid_skene starts (or as
    it is, for adaptive._consensus' fall-back); returns its mean max (the bar EM must
    clear)."""
    top = 0.0
    for s in range(0, m, BLOCK):
        vs = [v.astype(np.float32) for v in views.read(s, s + BLOCK)[:len(views.live)]]
        init = np.mean(vs[:nl] if nl else vs, axis=0)  # float32, as adaptive.py
        top += float(init.max(1).astype(np.float64).sum())
        p = init.astype(np.float64)
        post[s:s + BLOCK] = p / p.sum(1, keepdims=True) if normalise else p
    return top / m


def _stats(views: BlockViews, post: np.ndarray, m: int) -> tuple[np.ndarray, list[np.ndarray]]:
    mass = np.zeros(post.shape[1])
    cross: list[np.ndarray] | None = None
    for s in range(0, m, BLOCK):
        t = post[s:s + BLOCK]
        vs = views.read(s, s + BLOCK)
        mass += t.sum(0)
        parts = [t.T @ v for v in vs]
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
    start and is updated in place (the returned Consensus' posterior)."""
    m = len(post)
    w = np.asarray(weights, dtype=np.float64)
    mass, cross = _stats(views, post, m)
    pis: list[np.ndarray] = []
    done, loglik = 0, float("-inf")
    while done < iterations:
        done += 1
        prior = mass + 1e-6
        prior /= prior.sum()
        pis = _confusions(cross, smoothing)
        logs = [np.log(pi).T for pi in pis]
        mass, cross, moved, loglik = np.zeros_like(mass), [np.zeros_like(c) for c in cross], \
            0.0, 0.0
        for s in range(0, m, BLOCK):
            vs = views.read(s, s + BLOCK)
            log_t = np.broadcast_to(np.log(prior), (len(vs[0]), len(prior))).copy()
            for v, lp, lam in zip(vs, logs, w):
                if lam:
                    log_t += lam * (v @ lp)
            top = log_t.max(1, keepdims=True)
            log_t -= top
            new = np.exp(log_t)
            loglik += float((top[:, 0] + np.log(new.sum(1))).sum())
            new /= new.sum(1, keepdims=True)
            moved = max(moved, float(np.abs(new - post[s:s + BLOCK]).max()))
            post[s:s + BLOCK] = new
            mass += new.sum(0)
            cross = [a + new.T @ v for a, v in zip(cross, vs)]
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


def adaptive_targets_blocks(probs, lo: np.ndarray, hi: np.ndarray, names: Sequence[str],
                            self_probs: np.ndarray, features, seed: int = 0,
                            num_local: int | None = None) -> AdaptiveTargets:
    """adaptive.adaptive_targets on a (M, S, C) float32 spill ``probs`` (read by row slices),
    with each source's running min ``lo`` and max ``hi`` (S, C) over the samples (dead
    sources), and θ_{t+1}'s features (M, D) for the cluster view read the same way."""
    m, s_all, c = probs.shape
    num_local = max(1, s_all - 2) if num_local is None else num_local
    live = live_sources(lo, hi, m)
    dead = [SourceTrust(names[i], 0.0, None, "left out: the same output for every sample "
                        "(no information)") for i in range(s_all) if i not in live]
    if not live:
        return AdaptiveTargets(np.asarray(self_probs, np.float32), dead)
    nl = sum(i < num_local for i in live)
    w_models = [1.0 if i < num_local else SELF_WEIGHT / max(1, len(live) - nl) for i in live]
    post = np.empty((m, c), dtype=np.float64)
    views = BlockViews(probs, live)
    final = models = _consensus(views, nl, w_models, post)
    conf = models.mean_max_posterior
    lam = cluster_weight(conf) if features is not None and m > c else 0.0
    if lam > 0:
        assign, n = kmeans_assign(features, 2 * c, seed)
        final = _consensus(BlockViews(probs, live, assign, n), nl, w_models + [lam], post)
    sources = []
    for j, i in enumerate(live):
        acc = final.estimated_accuracy(j)
        sources.append(SourceTrust(names[i], w_models[j], acc, _verdict(acc, c)))
    reason = (f"the models' consensus is {conf:.3f} sure (mean max posterior), so clusters of "
              f"the averaged model's features count {lam:.2f}× a model")
    if features is not None:
        sources.append(SourceTrust("clusters", round(lam, 3), None, reason))
    return AdaptiveTargets(final.posterior.astype(np.float32), sources + dead, conf, lam, final)
