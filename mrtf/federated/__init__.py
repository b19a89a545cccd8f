"""Federation simulation: client updates, aggregation, rounds."""

from mrtf.federated.aggregate import average_received, average_states
from mrtf.federated.local import LocalConfig, LocalResult, accuracy, local_train
from mrtf.federated.simulate import (
    Federation,
    SimulationConfig,
    SimulationResult,
    export_received,
    export_target,
    prepare_federation,
    run_fedavg,
)

__all__ = [
    "Federation", "LocalConfig", "LocalResult", "SimulationConfig", "SimulationResult",
    "accuracy", "average_received", "average_states", "export_received", "export_target",
    "local_train",
    "prepare_federation", "run_fedavg",
]
