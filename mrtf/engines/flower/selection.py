"""Which parties train in a round, and the seeds they train with: the in-process engine's rules
(``mrtf.federated.runner``), so that a Flower run and an in-process run of one seed pick the
same parties and draw the same random numbers.

These two rules are copied, not imported: the engine's module is being restructured and only the
strategy contract is stable. ``tests/test_flower_checks.py`` pins them to the engine's.
"""

from __future__ import annotations

import numpy as np


def sub_seed(*parts: int | str) -> int:
    """A deterministic 31-bit seed from integers/strings (``mrtf.federated.methods.sub_seed``)."""
    ints = [p if isinstance(p, int) else int.from_bytes(p.encode(), "little") % (2 ** 31)
            for p in parts]
    return int(np.random.SeedSequence(ints).generate_state(1)[0] % (2 ** 31))


def chosen_parties(seed: int, rnd: int, clients: int, per_round: int) -> list[int]:
    """The parties (0..clients-1) that train in round ``rnd`` (0-based), sorted."""
    return sorted(np.random.default_rng([seed, rnd, 17]).choice(
        clients, size=per_round, replace=False).tolist())


def local_seed(seed: int, rnd: int, party: int) -> int:
    """The seed of a party's local training in a round (global torch RNG and batches)."""
    return sub_seed(seed, rnd, party, "local")
