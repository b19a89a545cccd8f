"""The adaptive refinery (``--method adaptive``, the default): targets whose trust in every
source is measured on the unlabeled target set, not fixed by Eq. 10's u_t.

What it replaces, and why (measured on bench/label_quality.py, see README):

- Eq. 10 mixes the local ensemble and the self-teachers θ_t, θ_{t+1} with
  u_t = 0.25 + 0.75·L̄/log C, set by the parties' *reported* training loss. Low local loss puts
  75 % of the target on θ_t and θ_{t+1} even when the average is poor (one-shot parties), and a
  good average with poor specialist parties gets the reverse. Here every source (each local
  model, θ_t, θ_{t+1}) is an annotator in a Dawid-Skene consensus (consensus.py): its
  confusion matrix, learnt by EM on the target set, decides how much each of its votes counts.
- Eq. 11-12 (the clustered label refinery) replaces the targets by nearest-prototype
  assignments on θ_{t+1}'s features, always (after round 5). Here the clusters of θ_{t+1}'s
  features are one more view with weight λ, set by how sure the models' own consensus is: when
  the models agree with confidence (mean max posterior ≥ 0.99) the clusters barely count; when
  the models leave the labels open, they count up to 3× a model.
- θ_t and θ_{t+1} are one federation's model a round apart, not independent annotators: they
  count 0.75 each (1.5 together), the local models 1 each. EM starts from the local models'
  AvgProb (Eq. 7), the paper's ensemble.
- A source whose output is the same for every sample (a dead network) carries no information:
  it is left out; when no model is left, the targets are θ_{t+1}'s own predictions.
- The class prior: the consensus either learns the target's class frequencies from the votes
  or first divides each source's class bias out (``debias``, a uniform prior). Which one is
  right depends on the target, not on the models, so by default both consensuses are formed
  and the one whose labels follow the target's own neighbourhoods better (beyond what
  their class frequencies give by chance) is kept (prior_choice.py, ``class_prior="auto"``).
- The vote assumes the sources err independently; when the target is new to all of them
  (novelty.py decides, from their entropy on it against their reported training loss), the
  pipeline adapts θ_{t+1} to the target (SHOT) instead of distilling these targets.

The constants (starts, 0.75, λ's scale and cap) were chosen on the label-quality grid itself
(24 received sets); there is no held-out grid, so read its numbers as in-sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from mrtf.compute.backend import choose_backend
from mrtf.refinery.cluster import kmeans_assign
from mrtf.refinery.consensus import Consensus
from mrtf.refinery.consensus_torch import em_on
from mrtf.refinery.debias import (
    DEBIAS_SCALE,
    debias,
    debias_strength,
    histogram_diversity,
    label_diversity,
    strength_of_counts,
)
from mrtf.refinery.prior_choice import CLASS_PRIORS, PriorChoice, choose_prior
from mrtf.refinery.votes import MemoryProbs, SourceStats, live_sources

__all__ = ["CLUSTER_CAP", "CLUSTER_SCALE", "DEBIAS_SCALE", "SELF_WEIGHT", "AdaptiveTargets",
           "ConsensusInputs", "SourceTrust", "adaptive_targets", "cluster_weight",
           "consensus_targets", "debias", "debias_strength", "estimated_accuracy",
           "histogram_diversity", "input_independent", "label_diversity"]

#: λ = min(CLUSTER_CAP, (1 - confidence) / CLUSTER_SCALE), confidence = the models' consensus'
#: mean max posterior. Chosen on the label-quality grid: clusters help where the models' own
#: consensus is ≤ 0.9 sure (label:2 one-shot, 10 FedAvg rounds) and cost points where it is
#: ≥ 0.96 sure (Dirichlet one-shot, 50 rounds).
CLUSTER_SCALE = 0.05
CLUSTER_CAP = 3.0
#: total weight of the self-teachers θ_t and θ_{t+1} in the consensus (a local model counts 1)
SELF_WEIGHT = 1.5


@dataclass
class SourceTrust:
    """How much one source counted. estimated_accuracy: Σ_c ρ_c π[c, c] under the consensus
    (None for the cluster view, whose answers are clusters, not classes)."""

    name: str
    weight: float
    estimated_accuracy: float | None
    reason: str

    def line(self) -> str:
        acc = "" if self.estimated_accuracy is None else \
            f"estimated accuracy {self.estimated_accuracy:.3f}, "
        return f"{self.name}: weight {self.weight:g}, {acc}{self.reason}"


@dataclass
class AdaptiveTargets:
    """targets (M, C) float32: the consensus posterior. sources: one SourceTrust per source.
    confidence: the models' consensus' mean max posterior (before the cluster view).
    consensus: the final Consensus (None when no model was informative).
    debias_strength: s of the sources' class-bias correction (``debias``), 0..1 (0 unless
    the uniform prior was used).
    prior: with class_prior "auto", which prior was kept and why (prior_choice.py).
    class_shares: the target's class shares (C,) the bias correction aimed at, where the
    user gave them (ConsensusInputs.class_shares); None otherwise."""

    targets: np.ndarray
    sources: list[SourceTrust] = field(default_factory=list)
    confidence: float = 0.0
    cluster_weight: float = 0.0
    consensus: Consensus | None = None
    debias_strength: float = 0.0
    prior: PriorChoice | None = None
    class_shares: np.ndarray | None = None


def input_independent(probs: np.ndarray, tol: float = 1e-6) -> bool:
    """True when a model's target predictions (M, C) are the same for every sample: its
    output no longer depends on the input (e.g. every ReLU of a layer is dead)."""
    probs = np.asarray(probs)
    return len(probs) > 1 and float(np.ptp(probs, axis=0).max()) <= tol


def cluster_weight(confidence: float, scale: float = CLUSTER_SCALE,
                   cap: float = CLUSTER_CAP) -> float:
    """λ of the cluster view from the models' consensus confidence (see module docstring)."""
    return float(min(cap, max(0.0, (1.0 - confidence) / scale)))


def _verdict(acc: float, num_classes: int) -> str:
    if acc >= 0.5:
        return "trusted"
    if acc >= 1.5 / num_classes:
        return "partly trusted (its votes count by its confusion matrix)"
    return "near chance: its votes carry almost no weight"


@dataclass
class ConsensusInputs:
    """What the consensus needs beside the sources' softmax. names: one per source, in its
    order. self_probs (M, C): θ_{t+1}'s (or the student's) softmax, the fall-back target.
    features (M, D): θ_{t+1}'s features for the cluster view (an array or a spill read by row
    slices), or None (no cluster view). num_local: how many of the sources (the first) are
    local models (default: all but the last two, θ_t and θ_{t+1}). class_prior: see
    :func:`adaptive_targets`. source_weights: optional factor per source (S,) on its
    consensus weight, e.g. 0.5 for a party mrtf.trust.reliability down-weighted (default:
    all 1). neighbours (M, k): each sample's nearest target samples in the target's own input
    space (mrtf.trust.neighbours.target_neighbours), for class_prior "auto". device: where
    the cluster view's k-means and the EM run (the refine's ``state.dev``; None: CUDA when
    present); on the CPU, faiss-cpu and numpy as always. class_shares (C,): the target's class
    frequencies as the user gave them (RefineConfig.class_shares); with them each model's
    class bias is divided out toward them ("given"), not toward an even spread, and "auto"
    chooses between that and the learned prior (without neighbourhoods: "given")."""

    names: Sequence[str]
    self_probs: np.ndarray
    features: object = None
    seed: int = 0
    num_local: int | None = None
    class_prior: str = "auto"
    source_weights: Sequence[float] | None = None
    neighbours: np.ndarray | None = None
    device: str | torch.device | None = None
    class_shares: Sequence[float] | None = None


def adaptive_targets(probs: np.ndarray, names: Sequence[str], self_probs: np.ndarray,
                     features: np.ndarray | None, seed: int = 0,
                     num_local: int | None = None, class_prior: str = "auto",
                     neighbours: np.ndarray | None = None) -> AdaptiveTargets:
    """Targets from every source, weighted by what the target set says about each.

    probs (S, M, C): the sources' stabilized softmax (Eq. 6), in the order of ``names``,
    in memory (the refinery calls :func:`consensus_targets`, which also reads a spill).
    class_prior: "auto" (default): the consensus is formed under both priors below and the
        one whose labels follow the target's ``neighbours`` better than chance by more is
        kept (prior_choice.py; without neighbours, "learned"); "learned": the consensus
        learns the class frequencies; "uniform": each source's class bias is divided out
        first (``debias``), for targets known to hold every class about equally often.
    The rest as :class:`ConsensusInputs`.
    """
    stats = SourceStats(probs.shape[0], probs.shape[2])
    stats.add(probs)
    return consensus_targets(MemoryProbs(probs), stats, ConsensusInputs(
        names, self_probs, features, seed, num_local, class_prior, None, neighbours))


def consensus_targets(store, stats: SourceStats, inputs: ConsensusInputs) -> AdaptiveTargets:
    """Steps 1-4 of the default (README "How adaptive works"), on the sources' softmax where
    the storage keeps it (votes.MemoryProbs or votes.SpilledProbs) with each source's
    whole-M statistics ``stats``: dead sources left out (1), the Dawid-Skene consensus of the
    rest (2) with the cluster view (3), under each class prior to form, keeping one (4)."""
    if inputs.class_prior not in CLASS_PRIORS:
        raise ValueError(f"class_prior must be one of {CLASS_PRIORS}, got "
                         f"{inputs.class_prior!r}")
    with store.context():
        live = live_sources(stats.lo, stats.hi, store.m)
        dead = [SourceTrust(inputs.names[i], 0.0, None, "left out: the same output for every "
                            "sample (no information)") for i in range(store.sources)
                if i not in live]
        if not live:
            return AdaptiveTargets(np.asarray(inputs.self_probs, np.float32), dead)
        clusters = Clusters(inputs.features, store.classes, inputs.seed, device=inputs.device)
        # learned first: on a spill the uniform prior rewrites the softmax in place
        return keep_one([_one_prior(store, stats, inputs, live, dead, clusters, prior)
                         for prior in priors_to_form(inputs.class_prior, inputs.neighbours,
                                                     inputs.class_shares is not None)],
                        inputs.neighbours)


def priors_to_form(class_prior: str, neighbours: np.ndarray | None, given: bool = False
                   ) -> tuple[str, ...]:
    """The class priors to form a consensus under: both for "auto" (one, learned, when there
    are no neighbourhoods to choose with), else the one asked for; where the user gave the
    class frequencies, "given" (the bias divided out toward them) takes uniform's place and
    is formed alone without neighbourhoods."""
    if given:
        return ("given",) if neighbours is None else ("learned", "given")
    if class_prior != "auto":
        return (class_prior,)
    return ("learned",) if neighbours is None else ("learned", "uniform")


def keep_one(runs: list[AdaptiveTargets], neighbours: np.ndarray | None) -> AdaptiveTargets:
    """The consensus to keep: the only one, or of [learned, uniform] the one whose labels
    follow the target's neighbourhoods better than chance by more (prior_choice.py), with
    the choice attached."""
    if len(runs) == 1:
        return runs[0]
    assert neighbours is not None
    other = "uniform" if runs[1].class_shares is None else "given"
    choice = choose_prior(runs[0].targets.argmax(1), runs[1].targets.argmax(1), neighbours,
                          other)
    out = runs[1] if choice.chosen == other else runs[0]
    out.prior = choice
    return out


def model_weights(live: Sequence[int], num_sources: int, num_local: int | None,
                  source_weights: Sequence[float] | None) -> tuple[int, list[float]]:
    """How many of the live sources are local models, and each live source's consensus
    weight (1 per local model, ``SELF_WEIGHT`` shared by θ_t and θ_{t+1}, times its factor)."""
    num_local = max(1, num_sources - 2) if num_local is None else num_local
    nl = sum(i < num_local for i in live)
    # θ_t and θ_{t+1} are one federation's model a round apart, not two independent
    # annotators: together they count 1.5 (0.75 each; 1 each let a confident average at
    # chance outvote specialist parties, 0.5 each lost 2 points on mnist5k→mnistm5k)
    w = [1.0 if i < num_local else SELF_WEIGHT / max(1, len(live) - nl) for i in live]
    if source_weights is not None:
        w = [x * float(source_weights[i]) for x, i in zip(w, live)]
    return nl, w


class Clusters:
    """The cluster view (k-means of θ_{t+1}'s features into 2C clusters), made once and only
    when asked: it does not depend on the class prior. ``get()`` gives (assignments (M,),
    clusters n); ``make(features, k, seed, backend=...)`` builds them (cluster.kmeans_assign,
    which reads an array or a spill alike) on ``device``'s backend (mrtf.compute.backend)."""

    def __init__(self, features, c: int, seed: int, make: Callable = kmeans_assign,
                 device: str | torch.device | None = None) -> None:
        self.features, self.c, self.seed, self.make, self._made = features, c, seed, make, None
        self.device = device
        self.usable = features is not None and len(features) > c

    def get(self):
        if self._made is None:
            self._made = self.make(self.features, 2 * self.c, self.seed,
                                   backend=choose_backend(self.device))
        return self._made


def measured_consensus(votes, nl: int, weights: list[float],
                       device: str | torch.device | None = None) -> Consensus:
    """Dawid-Skene from the sources' AvgProb (Eq. 7). EM can drift to its uninformative fixed
    point (every confusion row alike, posterior = prior) when the votes are flat; a consensus
    less sure than the AvgProb it started from is that case, and the AvgProb is kept. (On the
    24 received sets of the label-quality grid EM always ended surer than it started. Starting
    from several points and keeping the likeliest consensus was worse there: 0.606 against
    0.627 mean target accuracy; the votes are not independent given the class, as the model
    assumes, so its likelihood is a poor judge.) EM runs on ``device`` (consensus_torch.py;
    numpy on the CPU)."""
    post, bar = votes.start(nl, device)
    out = em_on(votes.votes(), post, weights, device)
    if out.mean_max_posterior >= bar:
        return out
    return votes.fallback(out.log_likelihood)


def _one_prior(store, stats: SourceStats, inputs: ConsensusInputs, live: list[int],
               dead: list[SourceTrust], clusters: Clusters, class_prior: str
               ) -> AdaptiveTargets:
    """consensus_targets under one class prior ("learned", "uniform" or "given": the bias
    divided out toward ``inputs.class_shares``)."""
    shares = None if class_prior != "given" else np.asarray(inputs.class_shares, np.float64)
    strength = strength_of_counts(stats.counts, live) if class_prior != "learned" else 0.0
    votes = store.model_votes(live, strength, stats, shares)
    nl, w_models = model_weights(live, store.sources, inputs.num_local, inputs.source_weights)
    models = measured_consensus(votes, nl, w_models, inputs.device)
    conf = models.mean_max_posterior
    lam = cluster_weight(conf) if clusters.usable else 0.0
    final = models
    if lam > 0:
        final = measured_consensus(votes.with_clusters(*clusters.get()), nl, w_models + [lam],
                                   inputs.device)
    sources = source_report(final, [inputs.names[i] for i in live], w_models, store.classes,
                            conf, lam, clusters.features is not None)
    return AdaptiveTargets(final.posterior.astype(np.float32), sources + dead, conf, lam, final,
                           strength, class_shares=shares)


def source_report(final: Consensus, names: Sequence[str], weights: Sequence[float],
                  num_classes: int, confidence: float, lam: float, clustered: bool
                  ) -> list[SourceTrust]:
    """One SourceTrust per live source (in consensus order) and, with a cluster view, why the
    clusters counted what they did."""
    sources = []
    for j, name in enumerate(names):
        acc = final.estimated_accuracy(j)
        sources.append(SourceTrust(name, weights[j], acc, _verdict(acc, num_classes)))
    reason = (f"the models' consensus is {confidence:.3f} sure (mean max posterior), so "
              f"clusters of the student's own features (θ_{{t+1}}, or the party it starts "
              f"from) count {lam:.2f}× a model")
    if clustered:
        sources.append(SourceTrust("clusters", round(lam, 3), None, reason))
    return sources


def estimated_accuracy(consensus_posterior: np.ndarray, probs: np.ndarray) -> float:
    """mean_x T(x, argmax_c p(x)): the accuracy a model's labels would have if the consensus
    posterior T were the truth; a label-free score to compare two models on the target set."""
    pick = np.asarray(probs).argmax(1)
    return float(np.asarray(consensus_posterior)[np.arange(len(pick)), pick].mean())
