"""One simulated federation in memory (no run directory): a (seed, method) track of the round
engine, composed from a :class:`RunConfig` (:func:`build_engine`, which the run directory's
runner uses too).

The server holds an unlabeled target set; K clients hold non-IID splits of the rest. Each
round R·K clients train from the global model and the strategy makes the next one. The
result remembers each client's latest update, so what a pilot party receives can be exported
afterwards (``export.py``) or, as a listener, at the end of the last round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from mrtf.device import pick_device
from mrtf.federated.clients import make_client
from mrtf.federated.engine import Engine, RoundEvent, RoundListener, Track, server_context
from mrtf.federated.export import ReceivedHistory, config_json
from mrtf.federated.federation import (
    Federation,
    check_target_fits,
    prepare_federation,
)
from mrtf.federated.methods import make_strategy
from mrtf.federated.run_config import RunConfig
from mrtf.federated.strategies.base import ClientUpdate
from mrtf.federated.strategies.dp import DifferentialPrivacy
from mrtf.io.bundles import ReceivedSet


def build_engine(cfg: RunConfig, fed: Federation, seed: int, method: str,
                 device: torch.device, listeners: Sequence[RoundListener] = ()) -> Engine:
    """The engine of one (seed, method) track: the method's strategy (wrapped in DP when
    ``dp_sigma`` or ``dp_clip`` is set) and the configured client algorithm."""
    strategy = make_strategy(method, server_context(fed, cfg.arch, seed, device, cfg))
    if cfg.dp_sigma > 0 or cfg.dp_clip > 0:
        strategy = DifferentialPrivacy(strategy, cfg.dp_sigma, cfg.dp_clip)
    local = cfg.local_config()
    client = make_client(cfg.local_algorithm, local, cfg.clients)
    track = Track(method, seed, cfg.rounds, cfg.per_round, cfg.eval_every)
    return Engine(fed, strategy, client, local, track, listeners)


@dataclass
class SimulationResult:
    """One track run in memory: its metrics rows, final global state and federation."""

    config: RunConfig
    seed: int
    method: str
    records: list[dict]
    global_state: dict[str, torch.Tensor]
    federation: Federation
    history: ReceivedHistory = field(default_factory=ReceivedHistory)

    @property
    def last(self) -> RoundEvent:
        return self.history.last[(self.seed, self.method)]

    @property
    def latest(self) -> dict[int, tuple[int, ClientUpdate]]:
        """client → (round, update): each party's latest model (FedKF's OCA teacher)."""
        return self.history.latest[(self.seed, self.method)]

    def received(self, history: bool = False) -> ReceivedSet:
        return self.history.received((self.seed, self.method), history,
                                     {"mrtf.simulation": config_json(self.config)})


def simulate(cfg: RunConfig, seed: int | None = None, method: str | None = None,
             fed: Federation | None = None, device: torch.device | str | None = None,
             listeners: Sequence[RoundListener] = (),
             on_record: Callable[[dict], None] | None = None) -> SimulationResult:
    """Run one track of ``cfg`` (default: its first seed and method) in memory."""
    cfg.validate()
    seed = cfg.seeds[0] if seed is None else seed
    method = method or cfg.methods[0]
    fed = fed or prepare_federation(cfg, seed)
    check_target_fits(fed, cfg.arch)
    history = ReceivedHistory()
    hooks: list[RoundListener] = [history, *listeners]
    if on_record is not None:
        hooks.append(_OnRecord(on_record))
    engine = build_engine(cfg, fed, seed, method, pick_device(device), hooks)
    ts = engine.run()
    return SimulationResult(cfg, seed, method, ts.records, ts.global_state, fed, history)


def run_fedavg(cfg: RunConfig, fed: Federation | None = None,
               on_record: Callable[[dict], None] | None = None,
               device: torch.device | str | None = None, seed: int | None = None
               ) -> SimulationResult:
    """FedAvg on ``cfg``'s federation (its first seed unless ``seed``)."""
    return simulate(cfg, seed, "fedavg", fed, device, on_record=on_record)


class _OnRecord:
    def __init__(self, fn: Callable[[dict], None]) -> None:
        self.fn = fn

    def on_round_end(self, event: RoundEvent) -> None:
        if event.record is not None:
            self.fn(event.record)
