"""A Flower strategy (``flwr.serverapp.strategy.Strategy``) that drives one of mrtf's strategy
objects (``mrtf.federated.methods.make_strategy``): ``configure_train`` picks the round's parties
as the in-process engine does and sends each θ_t with its settings; ``aggregate_train`` checks
every reply, leaves out (and names) the parties that failed, did not answer or sent a bad
model, and hands the rest to the mrtf strategy's ``aggregate``. The server logic stays in the
mrtf strategy; this class only moves records."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy as FlowerStrategy

from mrtf.engines.flower.checks import Expected, PartyRejected, cap_claims, enough_parties
from mrtf.engines.flower.config import FlowerConfig
from mrtf.engines.flower.records import reply_update, to_record
from mrtf.engines.flower.roster import Roster
from mrtf.engines.flower.scoring import score
from mrtf.engines.flower.selection import chosen_parties
from mrtf.federated.methods import ServerContext


class MrtfFlowerStrategy(FlowerStrategy):
    """Flower's side of the round; ``strategy`` is mrtf's (fedavg, feddf, mrtf, adaptive,
    fedftg, fedkf). ``records`` receives one metrics row per evaluated round."""

    def __init__(self, cfg: FlowerConfig, strategy: Any, ctx: ServerContext, roster: Roster,
                 init_state: dict[str, torch.Tensor], target_y: np.ndarray | None,
                 say: Callable[[str], None], rounds: int | None = None) -> None:
        self.cfg, self.strategy, self.ctx, self.roster = cfg, strategy, ctx, roster
        self.state = {k: v.detach().cpu().clone() for k, v in init_state.items()}
        self.target_y, self.say = target_y, say
        self.rounds = rounds or cfg.num_rounds
        self.records: list[dict] = []
        self.last_updates: list = []
        self._sent: dict[int, int] = {}  # node → party, this round
        self._t0 = 0.0
        self._target_x = torch.from_numpy(np.asarray(ctx.target.read(0, None)))

    # ------------------------------------------------------------------ training
    def parties(self, rnd: int) -> list[int]:
        """This round's parties (0-based round): the in-process engine's choice."""
        return chosen_parties(self.cfg.seed, rnd, self.cfg.clients, self.cfg.per_round)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._t0 = time.perf_counter()
        rnd = server_round - 1
        chosen = self.parties(rnd)
        base = {**self.cfg.client_config(), "round": rnd,
                "image_shape": list(self.ctx.image_shape), "norm": self.cfg.norm}
        extra = {}
        if self.strategy.name == "fedkf":  # FedKF's client half needs the OCA teacher ŵ^{t-1}
            extra["teacher"] = to_record(self.strategy.oca)
        self._sent, msgs = {}, []
        for party in chosen:
            node = self.roster.node_of.get(party)
            if node is None:
                self.say(f"round {server_round}: party {party} is not connected; left out")
                continue
            content = RecordDict({"arrays": arrays, "config": ConfigRecord(
                {**base, "party": party}), **extra})
            msgs.append(Message(content, dst_node_id=node, message_type="train"))
            self._sent[node] = party
        self.say(f"round {server_round}: training parties {sorted(self._sent.values())}")
        return msgs

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        rnd = server_round - 1
        expected = Expected(self.state, self.ctx.num_classes, rnd)
        updates, waiting = [], dict(self._sent)
        for reply in replies:
            node = reply.metadata.src_node_id
            party = waiting.pop(node, None)
            if party is None:
                continue  # not asked this round (a late reply): never used
            who = f"party {party} (node {node})"
            try:
                updates.append(reply_update(who, party, reply, expected))
            except PartyRejected as exc:
                self.say(f"round {server_round}: {exc}; left out")
        for node, party in sorted(waiting.items(), key=lambda kv: kv[1]):
            self.say(f"round {server_round}: party {party} (node {node}) did not answer "
                     f"within {self.cfg.round_timeout:g} s; left out")
        enough_parties(len(updates), self.cfg.min_parties, f"round {server_round}")
        updates.sort(key=lambda u: u.client)  # the in-process engine's order
        updates, capped = cap_claims(updates, self.roster.sizes)
        for line in capped:
            self.say(f"round {server_round}: {line}")
        self.last_updates = updates
        evaluate = (server_round % self.cfg.eval_every == 0 or server_round == self.rounds)
        agg = self.strategy.aggregate(rnd, self.state, updates, evaluate)
        for line in agg.warnings:
            self.say(f"warning: {line}")
        self.state = {k: v.detach().cpu().clone() for k, v in agg.state.items()}
        seconds = time.perf_counter() - self._t0
        losses = [u.train_loss for u in updates if np.isfinite(u.train_loss)]
        row: dict[str, Any] = {"round": server_round, "parties": [u.client for u in updates],
                               "local_loss": float(np.mean(losses)) if losses else None,
                               "seconds": round(seconds, 4)}
        if evaluate and self.target_y is not None:
            row.update(score(agg, self.ctx.build, self._target_x, self.target_y))
        if evaluate:
            self.records.append(row)
        metrics = {k: v for k, v in row.items() if isinstance(v, int | float) and v is not None}
        self.say(f"round {server_round}: " + ", ".join(
            f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()))
        return to_record(self.state), MetricRecord(metrics)

    # ------------------------------------------------------------------ no client evaluation
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return []  # the server scores on its own target set

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        self.say(f"mrtf strategy {self.strategy.name}: {self.rounds} round(s), "
                 f"{self.cfg.per_round} of {self.cfg.clients} parties per round, at least "
                 f"{self.cfg.min_parties}, seed {self.cfg.seed}")
