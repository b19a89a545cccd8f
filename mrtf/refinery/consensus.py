"""Label consensus without labels: Dawid & Skene (1979) over every source of evidence.

Each received model (and any other view of the target set, e.g. a clustering) is treated as an
annotator with its own confusion matrix π_v[c, a] = P(view v says a | true class c), learnt from
the target set alone by EM. A party that only knows two classes, a parameter average that is
still at chance, or a clustering whose clusters cut across classes all get a confusion matrix
that says so, and their votes count only as much as that matrix makes them worth. This replaces
the fixed mix of Eq. 10 (u_t from the parties' reported loss) with weights measured on the data.

E-step:  T(x, c) ∝ ρ_c · Π_v Π_a π_v[c, a]^(λ_v · V_v(x, a))
M-step:  π_v[c, a] ∝ Σ_x T(x, c) V_v(x, a) + α / A_v,   ρ_c ∝ Σ_x T(x, c)

V_v (M, A_v) is a view's soft vote (a teacher's stabilized softmax, Eq. 6, or a one-hot cluster
assignment; A_v need not equal C); λ_v scales a view's evidence (1 for models).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch


@dataclass
class Consensus:
    """posterior (M, C): P(class | all views); prior (C,): ρ; confusions: one (C, A_v) matrix
    per view; iterations: EM steps run; log_likelihood: Σ_x log Σ_c ρ_c Π_v π_v[c, ·]^(λ_v V_v)
    at the end (compares EM runs from different starts on the same views)."""

    posterior: np.ndarray
    prior: np.ndarray
    confusions: list[np.ndarray]
    iterations: int
    log_likelihood: float = float("-inf")

    def estimated_accuracy(self, view: int) -> float:
        """Σ_c ρ_c π_v[c, c]: how often view ``view`` names the true class, as the consensus
        estimates it (for views whose answers are classes)."""
        pi = self.confusions[view]
        return float((self.prior * np.diag(pi[:, :len(self.prior)])).sum())

    @property
    def mean_max_posterior(self) -> float:
        """The consensus' own estimate of its labels' accuracy: mean_x max_c T(x, c)."""
        return float(self.posterior.max(1).mean())


def confusion(posterior: np.ndarray, votes: np.ndarray, smoothing: float = 1.0) -> np.ndarray:
    """M-step for one view: π[c, a] ∝ Σ_x T(x, c) V(x, a) + α/A, rows sum to 1. (C, A)."""
    pi = posterior.T @ votes + smoothing / votes.shape[1]
    return pi / pi.sum(1, keepdims=True)


class Votes(Protocol):
    """The views' votes, where the one EM loop (:func:`em`) finds them: in memory
    (:class:`MemoryVotes`) or read from a spill by row blocks (votes.BlockViews). Each
    storage keeps its own summation order, so each gives the numbers it always gave."""

    def blocks(self, m: int) -> Iterable[tuple[int, int]]:
        """Row ranges [s, e) covering the M rows, in order."""
        ...

    def read(self, s: int, e: int) -> Any:
        """The votes of rows [s, e), in whatever form ``evidence`` and ``cross`` take."""
        ...

    def evidence(self, log_prior: np.ndarray, pis: list[np.ndarray], weights: np.ndarray
                 ) -> Callable[[Any], np.ndarray]:
        """For one E-step: a function of a block's votes → log ρ_c + Σ_v λ_v V_v log π_vᵀ."""
        ...

    def cross(self, t: np.ndarray, block: Any) -> list[np.ndarray]:
        """Σ_x T(x, c) V_v(x, a) of one block for every view: [(C, A_v)]."""
        ...

    def on_device(self, device: torch.device) -> list[torch.Tensor]:
        """Every view's votes (M, A_v) as float64 tensors on ``device`` (consensus_torch.py's
        EM); a storage may keep them there for the next EM on the same votes."""
        ...


class MemoryVotes:
    """Views held whole (M, A_v) in float64: one block of all M rows; the E-step adds the
    views' evidence one by one, the M-step is one GEMM per view."""

    def __init__(self, views: Sequence[np.ndarray]) -> None:
        self.views = [np.asarray(v, dtype=np.float64) for v in views]

    def blocks(self, m: int) -> Iterable[tuple[int, int]]:
        return [(0, m)]

    def read(self, s: int, e: int) -> list[np.ndarray]:
        return [v[s:e] for v in self.views]

    def evidence(self, log_prior: np.ndarray, pis: list[np.ndarray], weights: np.ndarray
                 ) -> Callable[[list[np.ndarray]], np.ndarray]:
        def run(block: list[np.ndarray]) -> np.ndarray:
            log_t = np.broadcast_to(log_prior, (len(block[0]), len(log_prior))).copy()
            for v, pi, lam in zip(block, pis, weights):
                if lam:
                    log_t += lam * (v @ np.log(pi).T)
            return log_t
        return run

    def cross(self, t: np.ndarray, block: list[np.ndarray]) -> list[np.ndarray]:
        return [t.T @ v for v in block]

    def on_device(self, device: torch.device) -> list[torch.Tensor]:
        return [torch.from_numpy(v).to(device) for v in self.views]


def statistics(votes: Votes, post: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Σ_x T(x, c) and Σ_x T(x, c) V_v(x, a) for every view, added block by block."""
    m, c = post.shape
    mass = np.zeros(c)
    cross: list[np.ndarray] | None = None
    for s, e in votes.blocks(m):
        t = post[s:e]
        mass += t.sum(0)
        parts = votes.cross(t, votes.read(s, e))
        cross = parts if cross is None else [a + b for a, b in zip(cross, parts)]
    assert cross is not None
    return mass, cross


def confusions(cross: list[np.ndarray], smoothing: float = 1.0) -> list[np.ndarray]:
    """The M-step's π_v from accumulated Σ_x T(x, c) V_v(x, a) (as :func:`confusion`)."""
    out = []
    for pv in cross:
        pi = pv + smoothing / pv.shape[1]
        out.append(pi / pi.sum(1, keepdims=True))
    return out


def em(votes: Votes, post: np.ndarray, weights: Sequence[float], iterations: int = 30,
       smoothing: float = 1.0, tol: float = 1e-6) -> Consensus:
    """The Dawid-Skene EM loop (module docstring), for votes in memory or in blocks.

    post (M, C) float64: the normalised start, updated in place (the returned posterior).
    One pass over the blocks per EM step does both halves: a block's E-step uses the
    confusions of the previous M-step, and its new posterior is added at once into the next
    M-step's statistics. Stops when no posterior moves more than ``tol`` or after
    ``iterations`` steps. Deterministic; float64 throughout."""
    m = len(post)
    w = np.asarray(weights, dtype=np.float64)
    mass, cross = statistics(votes, post)
    pis: list[np.ndarray] = []
    done, loglik = 0, float("-inf")
    while done < iterations:
        done += 1
        prior = mass + 1e-6
        prior /= prior.sum()
        pis = confusions(cross, smoothing)
        joint = votes.evidence(np.log(prior), pis, w)
        mass, cross = np.zeros_like(mass), [np.zeros_like(x) for x in cross]
        moved, loglik = 0.0, 0.0
        for s, e in votes.blocks(m):
            block = votes.read(s, e)
            log_t = joint(block)
            top = log_t.max(1, keepdims=True)
            log_t -= top
            new = np.exp(log_t)
            loglik += float((top[:, 0] + np.log(new.sum(1))).sum())
            new /= new.sum(1, keepdims=True)
            moved = max(moved, float(np.abs(new - post[s:e]).max()))
            post[s:e] = new
            mass += new.sum(0)
            cross = [a + b for a, b in zip(cross, votes.cross(new, block))]
        if moved < tol:
            break
    prior = mass + 1e-6
    return Consensus(post, prior / prior.sum(), pis, done, loglik)


def dawid_skene(views: Sequence[np.ndarray], init: np.ndarray,
                weights: Sequence[float] | None = None, iterations: int = 30,
                smoothing: float = 1.0, tol: float = 1e-6) -> Consensus:
    """EM for the class posterior given ``views`` (each (M, A_v), rows of soft votes), held in
    memory (:func:`em` over :class:`MemoryVotes`).

    init (M, C): starting posterior (e.g. the sources' AvgProb, Eq. 7); stops when no posterior
    moves more than ``tol`` or after ``iterations`` steps. Deterministic; float64 throughout.
    """
    w = np.ones(len(views)) if weights is None else np.asarray(weights, dtype=np.float64)
    if len(w) != len(views):
        raise ValueError(f"{len(views)} views but {len(w)} weights")
    post = np.asarray(init, dtype=np.float64)
    post = post / post.sum(1, keepdims=True)
    return em(MemoryVotes(views), post, w, iterations, smoothing, tol)
