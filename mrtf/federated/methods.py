"""The method table: every server method a run can name, one row each, and the strategy class
that implements it (the strategies live one per module in :mod:`mrtf.federated.strategies`).

Methods (MrTF paper Sect. 4.4 and 5; FedFTG Alg. 2; FedKF Alg. 1):

* fedavg: the sample-weighted parameter average θ_{t+1}.
* feddf, st, st+rd, mrtf, adaptive: θ_{t+1}, then ``mrtf.refinery.refine`` on the target set
  with the round's local models, θ_t and θ_{t+1}; the refined model goes to the next round
  (``keep_training_on_average``: the authors' code, which only evaluates it).
* fedftg: θ_{t+1}, then one FedFTG ServerUpdate (I outer iterations), persistent generator.
* fedkf: the ACA w^t goes to the clients; the OCA ŵ^t (cache of every client's latest model)
  teaches the client-side generator + KD (Alg. 1 lines 13-22).

DP on the uploads is not a method but a wrapper around any of them
(:class:`~mrtf.federated.strategies.dp.DifferentialPrivacy`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mrtf.federated.strategies.base import (  # noqa: F401  (the strategy contract, re-exported)
    SCORES,
    Aggregated,
    ClientUpdate,
    MethodSettings,
    ServerContext,
    Strategy,
    sub_seed,
)
from mrtf.federated.strategies.fedavg import FedAvg
from mrtf.federated.strategies.fedftg import FedFTGStrategy
from mrtf.federated.strategies.fedkf import FedKFStrategy, fedkf_local_train  # noqa: F401
from mrtf.federated.strategies.refinery import (  # noqa: F401
    REFINERY_METHODS,
    TRAIN_ON_AVERAGE,
    RefineryStrategy,
    input_independent,
)


@dataclass(frozen=True)
class Method:
    """One row of the table: a method name and the strategy class that runs it."""

    name: str
    strategy: type[Strategy]
    summary: str


TABLE: dict[str, Method] = {m.name: m for m in (
    Method("fedavg", FedAvg, "sample-weighted parameter average"),
    Method("feddf", RefineryStrategy, "ensemble distillation on the target set (FedDF)"),
    Method("st", RefineryStrategy, "stabilized teachers (MrTF Eq. 3-7)"),
    Method("st+rd", RefineryStrategy, "stabilized teachers + rectified distillation"),
    Method("mrtf", RefineryStrategy, "MrTF: ST + RD + clustered label refinery"),
    Method("adaptive", RefineryStrategy, "the refinery's default, chosen from unlabeled data"),
    Method("fedftg", FedFTGStrategy, "data-free fine-tuning with a conditional generator"),
    Method("fedkf", FedKFStrategy, "client-side knowledge fusion, OCA teacher (FedKF)"),
)}
METHODS = tuple(TABLE)
#: method → strategy class, as in Flower's strategy registry
STRATEGIES = {name: row.strategy for name, row in TABLE.items()}


def make_strategy(method: str, ctx: ServerContext) -> Strategy:
    """A fresh strategy for ``method`` (a name of :data:`METHODS`)."""
    try:
        row = TABLE[method]
    except KeyError:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}") \
            from None
    return row.strategy(ctx, method)
