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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


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


def dawid_skene(views: Sequence[np.ndarray], init: np.ndarray,
                weights: Sequence[float] | None = None, iterations: int = 30,
                smoothing: float = 1.0, tol: float = 1e-6) -> Consensus:
    """EM for the class posterior given ``views`` (each (M, A_v), rows of soft votes).

    init (M, C): starting posterior (e.g. the sources' AvgProb, Eq. 7); stops when no posterior
    moves more than ``tol`` or after ``iterations`` steps. Deterministic; float64 throughout.
    """
    w = np.ones(len(views)) if weights is None else np.asarray(weights, dtype=np.float64)
    if len(w) != len(views):
        raise ValueError(f"{len(views)} views but {len(w)} weights")
    post = np.asarray(init, dtype=np.float64)
    post = post / post.sum(1, keepdims=True)
    vs = [np.asarray(v, dtype=np.float64) for v in views]
    pis: list[np.ndarray] = []
    done, loglik = 0, float("-inf")
    while done < iterations:
        done += 1
        prior = post.sum(0) + 1e-6
        prior /= prior.sum()
        pis = [confusion(post, v, smoothing) for v in vs]
        log_t = np.broadcast_to(np.log(prior), post.shape).copy()
        for v, pi, lam in zip(vs, pis, w):
            if lam:
                log_t += lam * (v @ np.log(pi).T)
        top = log_t.max(1, keepdims=True)
        log_t -= top
        new = np.exp(log_t)
        loglik = float((top[:, 0] + np.log(new.sum(1))).sum())
        new /= new.sum(1, keepdims=True)
        moved = float(np.abs(new - post).max())
        post = new
        if moved < tol:
            break
    prior = post.sum(0) + 1e-6
    return Consensus(post, prior / prior.sum(), pis, done, loglik)
