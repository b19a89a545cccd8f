"""Server strategies, one per module; :mod:`mrtf.federated.methods` maps method names to them."""

from mrtf.federated.strategies.base import (
    SCORES,
    Aggregated,
    ClientUpdate,
    MethodSettings,
    ServerContext,
    Strategy,
    sub_seed,
)
from mrtf.federated.strategies.dp import DifferentialPrivacy, privatize
from mrtf.federated.strategies.fedavg import FedAvg
from mrtf.federated.strategies.fedftg import FedFTGStrategy
from mrtf.federated.strategies.fedkf import FedKFStrategy, fedkf_local_train
from mrtf.federated.strategies.refinery import RefineryStrategy

__all__ = [
    "SCORES", "Aggregated", "ClientUpdate", "DifferentialPrivacy", "FedAvg", "FedFTGStrategy",
    "FedKFStrategy", "MethodSettings", "RefineryStrategy", "ServerContext", "Strategy",
    "fedkf_local_train", "privatize", "sub_seed",
]
