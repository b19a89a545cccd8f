"""Which parties train in a round, and the seeds they train with: the in-process engine's rules
(``mrtf.federated.engine``), imported, so that a Flower run and an in-process run of one seed
pick the same parties and draw the same random numbers."""

from __future__ import annotations

from mrtf.federated.engine import select_clients
from mrtf.federated.strategies.base import sub_seed

__all__ = ["chosen_parties", "local_seed", "sub_seed"]


def chosen_parties(seed: int, rnd: int, clients: int, per_round: int) -> list[int]:
    """The parties (0..clients-1) that train in round ``rnd`` (0-based), sorted."""
    return select_clients(seed, rnd, clients, per_round)


def local_seed(seed: int, rnd: int, party: int) -> int:
    """The seed of a party's local training in a round (global torch RNG and batches)."""
    return sub_seed(seed, rnd, party, "local")
