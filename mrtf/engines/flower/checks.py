"""Checks on what a party sends back (untrusted): its model's tensors and its metadata.

Everything a reply carries is compared with what the server expects before it reaches a
strategy: the same tensor names, shapes and dtypes as the global model, finite values no larger
than the bound the received-file reader uses, label counts for the run's class count that add up
to the party's sample count. A reply that fails gets one line naming the party and is left out
of the round; the others go on. No Flower import here, so the checks are unit-tested without it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from mrtf.errors import InputError
from mrtf.federated.methods import ClientUpdate
from mrtf.io.limits import MAX_ABS_WEIGHT, MAX_COUNT, MAX_LOSS
from mrtf.trust.reliability import CLAIM_CAP

#: slack for the .npy header around a tensor's raw bytes (Flower's Array holds np.save output)
NPY_HEADER_SLACK = 4096


class PartyRejected(InputError):
    """A party's reply that cannot be used; the message names the party and the reason."""


@dataclass(frozen=True)
class Expected:
    """What one round's replies must match."""

    state: dict[str, torch.Tensor]  # the global model: names, shapes, dtypes
    num_classes: int
    round: int  # 0-based, as the strategies count


def torch_dtype(name: str) -> torch.dtype | None:
    """The torch dtype of a numpy dtype name ('float32'), or None when torch has none."""
    try:
        return torch.from_numpy(np.zeros(0, dtype=np.dtype(name))).dtype
    except (TypeError, ValueError):
        return None


def check_declared(who: str, name: str, dtype: str, shape: Sequence[int], nbytes: int,
                   expected: torch.Tensor) -> None:
    """A tensor's declared dtype, shape and payload size, before a byte of it is decoded."""
    if tuple(int(s) for s in shape) != tuple(expected.shape):
        raise PartyRejected(f"{who}: tensor {name!r} has shape {tuple(shape)}, the model "
                            f"needs {tuple(expected.shape)} (a different architecture or "
                            "class count?)")
    if torch_dtype(dtype) != expected.dtype:
        raise PartyRejected(f"{who}: tensor {name!r} has dtype {dtype}, expected "
                            f"{str(expected.dtype).replace('torch.', '')}")
    limit = expected.numel() * expected.element_size() + NPY_HEADER_SLACK
    if nbytes > limit:
        raise PartyRejected(f"{who}: tensor {name!r} carries {nbytes} bytes, more than its "
                            f"shape allows ({limit})")


def check_state(who: str, arrays: Mapping[str, np.ndarray],
                expected: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Decoded arrays → a state dict in the expected order, or PartyRejected (one line)."""
    missing = [k for k in expected if k not in arrays]
    extra = [k for k in arrays if k not in expected]
    if missing or extra:
        what = f"lacks {missing[0]!r}" if missing else f"has an unknown tensor {extra[0]!r}"
        raise PartyRejected(f"{who}: its model {what} (not the run's architecture)")
    out: dict[str, torch.Tensor] = {}
    for name, ref in expected.items():
        a = arrays[name]
        if not isinstance(a, np.ndarray) or a.dtype.hasobject:
            raise PartyRejected(f"{who}: tensor {name!r} is not a numeric array")
        check_declared(who, name, str(a.dtype), a.shape, a.nbytes, ref)
        t = torch.from_numpy(np.array(a, copy=True))
        if t.is_floating_point():
            if not bool(torch.isfinite(t).all()):
                raise PartyRejected(f"{who}: tensor {name!r} holds NaN or infinite values")
            if t.numel() and float(t.abs().max()) > MAX_ABS_WEIGHT:
                raise PartyRejected(f"{who}: tensor {name!r} holds values beyond "
                                    f"±{MAX_ABS_WEIGHT:g}")
        out[name] = t
    return out


def check_metrics(who: str, metrics: Mapping[str, Any], num_classes: int, rnd: int
                  ) -> tuple[int, list[int], float]:
    """(n_samples, label_counts, train_loss) from a reply's metrics, or PartyRejected."""
    counts = metrics.get("label_counts")
    if not isinstance(counts, list | tuple) or not all(
            isinstance(c, int | np.integer) and not isinstance(c, bool) for c in counts):
        raise PartyRejected(f"{who}: sent no label counts (a list of integers)")
    if len(counts) != num_classes:
        raise PartyRejected(f"{who}: reports {len(counts)} classes, the run has {num_classes}")
    counts = [int(c) for c in counts]
    n = metrics.get("n_samples")
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or not 1 <= n <= MAX_COUNT:
        raise PartyRejected(f"{who}: n_samples {n!r} is not a count in [1, {MAX_COUNT:g}]")
    if min(counts) < 0 or sum(counts) != int(n):
        raise PartyRejected(f"{who}: its label counts add up to {sum(counts)}, not its "
                            f"n_samples {int(n)}")
    loss = metrics.get("train_loss", float("nan"))
    if not isinstance(loss, int | float) or isinstance(loss, bool):
        raise PartyRejected(f"{who}: train_loss {loss!r} is not a number")
    loss = float(loss)
    # NaN is what local training reports when it took no step; anything else must be a loss
    if not math.isnan(loss) and not 0.0 <= loss <= MAX_LOSS:
        raise PartyRejected(f"{who}: train_loss {loss!r} is outside [0, {MAX_LOSS:g}]")
    if metrics.get("round") != rnd + 1:
        raise PartyRejected(f"{who}: answers round {metrics.get('round')!r}, this is round "
                            f"{rnd + 1}")
    return int(n), counts, loss


def client_update(who: str, party: int, arrays: Mapping[str, np.ndarray],
                  metrics: Mapping[str, Any], expected: Expected) -> ClientUpdate:
    """A checked reply as the strategies' ``ClientUpdate``."""
    n, counts, loss = check_metrics(who, metrics, expected.num_classes, expected.round)
    state = check_state(who, arrays, expected.state)
    return ClientUpdate(party, state, n, counts, loss)


def claim_cap(claims: Sequence[int]) -> float:
    """The most samples one party's claim may count for in a training round: CLAIM_CAP × the
    median claim. (refine instead counts a received file's claim above it as the median
    claim: mrtf.trust.reliability.)"""
    return CLAIM_CAP * float(np.median(claims)) if claims else math.inf


def scaled_counts(counts: Sequence[int], n: int) -> list[int]:
    """Label counts scaled to add up to ``n`` (largest remainders), the class shares kept."""
    total = sum(counts)
    if total <= 0:
        return list(counts)
    exact = [c * n / total for c in counts]
    out = [int(e) for e in exact]
    for i in sorted(range(len(out)), key=lambda i: out[i] - exact[i])[:n - sum(out)]:
        out[i] += 1
    return out


def cap_claims(updates: Sequence[ClientUpdate], declared: Mapping[int, int]
               ) -> tuple[list[ClientUpdate], list[str]]:
    """n_samples is a party's claim and weights its model in the average: each is capped at
    what the party declared when it joined (``declared``, the roster) and at
    :func:`claim_cap` of this round's claims; its label counts are scaled with it. Returns the
    updates and one line per capped party."""
    cap = claim_cap([u.n_samples for u in updates])
    out, lines = [], []
    for u in updates:
        limit = min(cap, declared.get(u.client, math.inf))
        if u.n_samples <= limit:
            out.append(u)
            continue
        n = max(1, int(limit))
        lines.append(f"party {u.client} claims {u.n_samples:,} samples; counted as {n:,} "
                     f"(at most {CLAIM_CAP:g}× the round's median claim and what it declared "
                     "when it joined)")
        out.append(replace(u, n_samples=n, label_counts=scaled_counts(u.label_counts, n)))
    return out, lines


def enough_parties(have: int, minimum: int, what: str) -> None:
    """Fewer than ``minimum`` parties left: one line (the ServerApp stops, exit code 2)."""
    if have < minimum:
        raise InputError(f"{what}: {have} usable part{'y' if have == 1 else 'ies'}, fewer "
                         f"than the minimum of {minimum} (min-parties); stopping")
