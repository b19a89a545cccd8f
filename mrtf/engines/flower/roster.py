"""Who takes part: the server asks every connected SuperNode (a ``query`` message) which party
it is and what data it holds, and keeps the nodes whose answer fits the run. A node that does
not answer, answers with an error, names a party outside 0..clients-1 or one already taken, or
holds samples of another shape is named and left out; the run goes on with the rest."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from mrtf.trust.reliability import CLAIM_CAP


@dataclass
class Roster:
    node_of: dict[int, int] = field(default_factory=dict)  # party → node id
    sizes: dict[int, int] = field(default_factory=dict)  # party → n_samples

    def party_of(self, node: int) -> int | None:
        return next((p for p, n in self.node_of.items() if n == node), None)

    def client_sizes(self, clients: int) -> list[int]:
        """Every party's sample count (0 for a party that is not here), as the strategies
        (FedKF's OCA weights) expect them; a count is a claim, capped at CLAIM_CAP × the
        median count (mrtf.trust.reliability)."""
        claims = sorted(self.sizes.values())
        cap = CLAIM_CAP * claims[len(claims) // 2] if claims else 0
        return [int(min(self.sizes.get(k, 0), cap)) for k in range(clients)]


def build_roster(answers: Iterable[tuple[int, Any]], clients: int,
                 sample_shape: tuple[int, ...]) -> tuple[Roster, list[str]]:
    """Answers (node id, info dict or an error string) → the roster and one line per node left
    out. The first node to claim a party keeps it (nodes are taken in id order)."""
    roster, left = Roster(), []
    for node, info in sorted(answers, key=lambda a: a[0]):
        who = f"node {node}"
        if isinstance(info, str):
            left.append(f"{who}: left out: {info}")
            continue
        party, n, shape = info.get("partition_id"), info.get("n_samples"), \
            info.get("sample_shape")
        if isinstance(party, bool) or not isinstance(party, int) or not 0 <= party < clients:
            left.append(f"{who}: left out: partition-id {party!r} is not in 0..{clients - 1}")
        elif party in roster.node_of:
            left.append(f"{who}: left out: party {party} is already node "
                        f"{roster.node_of[party]}")
        elif isinstance(n, bool) or not isinstance(n, int) or n < 1:
            left.append(f"party {party} ({who}): left out: it holds no samples ({n!r})")
        elif not isinstance(shape, list) or tuple(shape) != tuple(sample_shape):
            left.append(f"party {party} ({who}): left out: its samples have shape "
                        f"{tuple(shape) if isinstance(shape, list) else shape!r}, the "
                        f"model takes {tuple(sample_shape)}")
        else:
            roster.node_of[party] = node
            roster.sizes[party] = n
    return roster, left


def gather(grid: Any, clients: int, sample_shape: tuple[int, ...], wait_s: float,
           timeout_s: float, say: Callable[[str], None]) -> Roster:
    """Wait up to ``wait_s`` for ``clients`` nodes, ask each who it is, build the roster."""
    from flwr.app import ConfigRecord, Message, RecordDict

    deadline = time.monotonic() + wait_s
    nodes = list(grid.get_node_ids())
    while len(nodes) < clients and time.monotonic() < deadline:
        time.sleep(0.5)
        nodes = list(grid.get_node_ids())
    say(f"{len(nodes)} SuperNode(s) connected, {clients} part{'y' if clients == 1 else 'ies'} "
        "expected")
    msgs = [Message(RecordDict({"ask": ConfigRecord({"what": "party"})}), dst_node_id=n,
                    message_type="query") for n in nodes]
    answers: dict[int, Any] = {}
    for reply in grid.send_and_receive(msgs, timeout=timeout_s):
        node = reply.metadata.src_node_id
        if reply.has_error():
            from mrtf.engines.flower.records import error_reason

            answers[node] = error_reason(reply.error.reason)
        else:
            info = reply.content.config_records.get("party")
            answers[node] = dict(info) if info is not None else "sent no party record"
    for n in nodes:
        answers.setdefault(n, f"did not answer within {timeout_s:g} s")
    roster, left = build_roster(answers.items(), clients, sample_shape)
    for line in left:
        say(line)
    return roster
