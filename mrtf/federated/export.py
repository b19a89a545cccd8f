"""Exporting what a pilot party receives, as listeners at the end of a round: each track's
last round (its local models and θ_t, with ``history`` every earlier client's latest model) as
the bundles ``mrtf refine`` reads, and the server's target set."""

from __future__ import annotations

import json
from pathlib import Path

from mrtf.federated.checkpoints import track_name
from mrtf.federated.engine import RoundEvent, RoundListener
from mrtf.federated.federation import export_target
from mrtf.federated.received import check_received_dir, write_received
from mrtf.federated.run_config import RunConfig
from mrtf.federated.strategies.base import ClientUpdate
from mrtf.io.bundles import ReceivedSet


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


def export_received(result, directory: str | Path, force: bool = False,
                    history: bool = False) -> list[Path]:
    """Write the last round's received models (see :class:`ExportReceived`)."""
    return write_received(result.received(history), directory, force)


def config_json(cfg: RunConfig) -> str:
    return json.dumps(cfg.to_dict(), sort_keys=True)
