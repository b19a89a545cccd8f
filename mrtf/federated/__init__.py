"""Federation simulation: one round engine driving a server strategy and a client algorithm
over a simulated federation; listeners watch the rounds (metrics, checkpoints, export)."""

from mrtf.federated.aggregate import average_received, average_states
from mrtf.federated.export import ExportReceived, export_received
from mrtf.federated.federation import Federation, export_target, prepare_federation
from mrtf.federated.local import LocalConfig, LocalResult, accuracy, local_train
from mrtf.federated.run_config import RunConfig
from mrtf.federated.simulate import SimulationResult, run_fedavg, simulate

__all__ = [
    "ExportReceived", "Federation", "LocalConfig", "LocalResult", "RunConfig",
    "SimulationResult", "accuracy", "average_received", "average_states", "export_received",
    "export_target", "local_train", "prepare_federation", "run_fedavg", "simulate",
]
