"""The round engine: one (seed, method) federation, round by round. The in-process simulation
(``mrtf simulate``, with or without a run directory) and the benchmarks all run it; server
logic is the strategy's, client training the client algorithm's, and whatever watches a run
(metrics, checkpoints, progress, exporting what a pilot party receives) is a listener called at
the end of every round.

Every random draw is seeded from (seed, round, client, purpose): the initial model from the
seed, each round's clients from (seed, round), each client's training from (seed, round,
client). So every method of a seed trains the same clients from the same θ_0, and a run
restarted from a checkpoint continues exactly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from mrtf.federated.checkpoints import TrackState
from mrtf.federated.clients import ClientAlgorithm
from mrtf.federated.federation import Federation
from mrtf.federated.local import LocalConfig
from mrtf.federated.received import received_set
from mrtf.federated.scoring import score
from mrtf.federated.strategies.base import (
    Aggregated,
    ClientUpdate,
    MethodSettings,
    ServerContext,
    Strategy,
    sub_seed,
)
from mrtf.io.bundles import ReceivedSet
from mrtf.models import build_model


def select_clients(seed: int, rnd: int, num_clients: int, per_round: int) -> list[int]:
    """The clients of round ``rnd`` (sorted): the same for every method of a seed."""
    return sorted(np.random.default_rng([seed, rnd, 17]).choice(
        num_clients, size=per_round, replace=False).tolist())


def server_context(fed: Federation, arch: str, seed: int, device: torch.device,
                   settings: MethodSettings) -> ServerContext:
    """What a strategy of this federation sees: the target set without its labels."""
    from mrtf.io.hdf5 import ArraySource

    c, h, w = fed.x.shape[1:]
    return ServerContext(arch=arch, num_classes=fed.num_classes, arch_kwargs=fed.arch_kwargs,
                         image_shape=(int(c), int(h), int(w)),
                         target=ArraySource(fed.target_x.numpy()),
                         client_sizes=[len(p) for p in fed.parts], seed=seed, device=device,
                         settings=settings)


@dataclass
class RoundEvent:
    """One finished round, as listeners see it. ``updates`` are what the server received
    (after DP noise, when the strategy is wrapped); ``record`` is the round's metrics row, or
    None when the round was not evaluated."""

    seed: int
    method: str
    round: int  # 0-based
    rounds: int
    start_state: dict[str, torch.Tensor]
    updates: list[ClientUpdate]
    aggregated: Aggregated
    state: TrackState
    record: dict | None
    federation: Federation
    context: ServerContext

    @property
    def last(self) -> bool:
        return self.round == self.rounds - 1

    def received(self, earlier: dict[int, tuple[int, ClientUpdate]] | None = None,
                 extra: dict[str, str] | None = None) -> ReceivedSet:
        """What a pilot party receives from this round (see :func:`received_set`)."""
        c = self.context
        return received_set(self.round, self.start_state, self.updates, arch=c.arch,
                            num_classes=c.num_classes, arch_kwargs=c.arch_kwargs,
                            earlier=earlier, extra=extra)


class RoundListener(Protocol):
    def on_round_end(self, event: RoundEvent) -> None: ...


@dataclass(frozen=True)
class Track:
    """One (seed, method) track of a run: ``rounds`` rounds of ``per_round`` clients, the
    global model scored every ``eval_every`` rounds (and after the last)."""

    method: str
    seed: int
    rounds: int
    per_round: int
    eval_every: int = 1


class Engine:
    """Runs ``rounds`` rounds of one federation with one strategy and one client algorithm."""

    def __init__(self, fed: Federation, strategy: Strategy, client: ClientAlgorithm,
                 local: LocalConfig, track: Track,
                 listeners: Sequence[RoundListener] = ()) -> None:
        self.fed, self.strategy, self.client, self.local = fed, strategy, client, local
        self.ctx = strategy.ctx
        self.method, self.seed, self.rounds = track.method, track.seed, track.rounds
        self.per_round, self.eval_every = track.per_round, track.eval_every
        self.listeners = list(listeners)
        torch.manual_seed(self.seed)  # the same initial model for every method of this seed
        self.model = build_model(self.ctx.arch, fed.num_classes, **fed.arch_kwargs)

    def initial_state(self) -> TrackState:
        """θ_0, handed to the strategy and the client algorithm (a run that does not resume)."""
        init = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.strategy.initialize(init)
        self.client.initialize(self.model)
        return TrackState(0, init)

    def run(self, ts: TrackState | None = None) -> TrackState:
        """Every round from ``ts`` (a checkpoint) or from the start, to the last one."""
        ts = ts or self.initial_state()
        for rnd in range(ts.round, self.rounds):
            self.round(ts, rnd)
        return ts

    def round(self, ts: TrackState, rnd: int) -> RoundEvent:
        t0 = time.perf_counter()
        chosen = select_clients(self.seed, rnd, len(self.fed.parts), self.per_round)
        start_state = ts.global_state
        updates = self.train_clients(rnd, chosen, start_state)
        evaluate = (rnd + 1) % self.eval_every == 0 or rnd == self.rounds - 1
        agg = self.strategy.aggregate(rnd, start_state, updates, evaluate)
        ts.global_state = {k: v.detach().cpu().clone() for k, v in agg.state.items()}
        ts.round = rnd + 1
        seconds = time.perf_counter() - t0
        ts.elapsed += seconds
        record = None
        if evaluate:
            scores = score(self.ctx, agg, self.fed, self.ctx.device)
            losses = [u.train_loss for u in updates if np.isfinite(u.train_loss)]
            record = {"seed": self.seed, "method": self.method, "round": rnd + 1,
                      "accuracy": scores[agg.primary], **scores,
                      "local_loss": float(np.mean(losses)) if losses else None,
                      "seconds": round(seconds, 4), "elapsed": round(ts.elapsed, 4)}
            ts.records.append(record)
            ts.done = ts.round == self.rounds
        event = RoundEvent(self.seed, self.method, rnd, self.rounds, start_state,
                           agg.updates if agg.updates is not None else updates, agg, ts,
                           record, self.fed, self.ctx)
        for listener in self.listeners:
            listener.on_round_end(event)
        return event

    def train_clients(self, rnd: int, chosen: list[int], start_state: dict[str, torch.Tensor]
                      ) -> list[ClientUpdate]:
        """One round's client updates: the strategy's own client update (FedKF), else the
        client algorithm's (FedAvg / FedProx / SCAFFOLD)."""
        fed, model, dev = self.fed, self.model, self.ctx.device
        model.load_state_dict(start_state)
        updates: list[ClientUpdate] = []
        for k in chosen:
            s = sub_seed(self.seed, rnd, k, "local")
            torch.manual_seed(s)  # dropout and anything else on the global RNG
            idx = torch.from_numpy(fed.parts[k])
            x, y = fed.x[idx], fed.y[idx]
            res = self.strategy.client_update(rnd, k, model, x, y, self.local, s)
            if res is None:
                res = self.client.train(k, model, x, y, fed.num_classes, s, dev)
            state = {n: v.detach().cpu().clone() for n, v in res.model.state_dict().items()}
            updates.append(ClientUpdate(k, state, res.n_samples, res.label_counts,
                                        res.train_loss))
        self.client.end_round()
        return updates
