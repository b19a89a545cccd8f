"""One simulated federation in memory (no run directory): a (seed, method) track of the round
engine, and what a pilot party receives from it (the export listener).

The server holds an unlabeled target set; K clients hold non-IID splits of the rest. Each
round R·K clients train from the global model and the strategy makes the next one; the
listener :class:`ExportReceived` writes the last round's local models and θ_t (and, with
``history``, every earlier client's latest model) as the bundles ``mrtf refine`` reads.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mrtf.device import pick_device
from mrtf.federated.checkpoints import track_name
from mrtf.federated.clients import make_client
from mrtf.federated.engine import Engine, RoundEvent, RoundListener, server_context
from mrtf.federated.federation import (
    Federation,
    check_target_fits,
    export_target,
    prepare_federation,
)
from mrtf.federated.methods import make_strategy
from mrtf.federated.received import check_received_dir, write_received
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
    return Engine(fed, strategy, client, local, method=method, seed=seed, rounds=cfg.rounds,
                  per_round=cfg.per_round, eval_every=cfg.eval_every, listeners=listeners)


class ReceivedHistory:
    """Listener: each track's last round and every client's latest update (round, update)."""

    def __init__(self) -> None:
        self.last: dict[tuple[int, str], RoundEvent] = {}
        self.latest: dict[tuple[int, str], dict[int, tuple[int, ClientUpdate]]] = {}

    def on_round_end(self, event: RoundEvent) -> None:
        key = (event.seed, event.method)
        self.latest.setdefault(key, {}).update({u.client: (event.round, u)
                                                for u in event.updates})
        self.last[key] = event

    def received(self, key: tuple[int, str], history: bool = False,
                 extra: dict[str, str] | None = None) -> ReceivedSet:
        """The track's last round as received models; with ``history`` also the latest model
        of every client that trained only in earlier rounds."""
        event = self.last[key]
        return event.received(self.latest[key] if history else None, extra)


class ExportReceived(ReceivedHistory):
    """Listener: at the end of a track's last round, write what a pilot party receives into
    ``directory`` (``directory/<track>`` when ``per_track``, for runs of several tracks)."""

    def __init__(self, directory: str | Path, force: bool = False, history: bool = False,
                 per_track: bool = False, extra: dict[str, str] | None = None) -> None:
        super().__init__()
        self.directory, self.force, self.history = Path(directory), force, history
        self.per_track, self.extra = per_track, extra
        self.written: list[Path] = []

    def check(self) -> None:
        """Refuse an existing output before any work."""
        check_received_dir(self.directory, self.force)

    def on_round_end(self, event: RoundEvent) -> None:
        super().on_round_end(event)
        if event.last:
            out = self.directory / track_name(event.seed, event.method) if self.per_track \
                else self.directory
            received = self.received((event.seed, event.method), self.history, self.extra)
            self.written += write_received(received, out, force=self.force or self.per_track)


class ExportTarget:
    """Listener: write the server's target set (x, and y for scoring) at the end of the run."""

    def __init__(self, path: str | Path, force: bool = False) -> None:
        from mrtf.io.atomic import check_output

        check_output(path, force)  # refused before any work
        self.path, self.written = Path(path), False

    def on_round_end(self, event: RoundEvent) -> None:
        if event.last and not self.written:
            export_target(event.federation, self.path)
            self.written = True


class Exports:
    """What a run exports (received models, history, the target set) as its listeners; every
    output is checked when this is made, so a refused export writes nothing."""

    def __init__(self, cfg: RunConfig, received: Path | None = None, target: Path | None = None,
                 history: bool = False, force: bool = False) -> None:
        from mrtf.errors import InputError

        tracks = len(cfg.seeds) * len(cfg.methods)
        if target is not None and len(cfg.seeds) > 1:
            raise InputError("--export-target writes one seed's target set; give one seed")
        if history and received is None:
            raise InputError("--export-history needs --export-received")
        self.received = self.target = None
        if received is not None:
            self.received = ExportReceived(received, force, history, per_track=tracks > 1,
                                           extra={"mrtf.simulation": config_json(cfg)})
            self.received.check()
        if target is not None:
            self.target = ExportTarget(target, force)

    @property
    def listeners(self) -> list[RoundListener]:
        return [x for x in (self.received, self.target) if x is not None]

    def written(self) -> dict[str, object]:
        """The paths written, for a summary."""
        out: dict[str, object] = {}
        if self.received is not None:
            out["received"] = [str(p) for p in self.received.written]
        if self.target is not None and self.target.written:
            out["target"] = str(self.target.path)
        return out


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


def export_received(result: SimulationResult, directory: str | Path, force: bool = False,
                    history: bool = False) -> list[Path]:
    """Write the last round's received models (see :class:`ExportReceived`)."""
    return write_received(result.received(history), directory, force)


def config_json(cfg: RunConfig) -> str:
    return json.dumps(cfg.to_dict(), sort_keys=True)


__all__ = ["ExportReceived", "ExportTarget", "Exports", "ReceivedHistory", "SimulationResult",
           "build_engine", "check_received_dir", "export_received", "export_target", "run_fedavg",
           "simulate"]
