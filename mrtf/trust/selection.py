"""Which received models count: the one rule (issue 35), before any data is read.

A received file's metadata are claims. ``mrtf.round`` picks the newest round's local models
(S_t) and ``mrtf.role = global`` picks θ_t, the round's starting model; obeyed blindly, one file
claiming round 10^6 left the nine honest parties "not used: older round", and one file posing
as θ_t of a later round made every honest party's output layer look renamed. So here:

- **copies** (sybils): files whose weights are identical, or within :data:`NEAR_COPY` × the
  typical distance between the parties, are one model under several names; it counts once (the
  first file by name), the others are named and not used;
- **the round**: the newest round that holds a strict majority of the distinct models of the
  best-attended round; a newer round claimed by fewer files is a claim that would leave out most
  parties: named and refused (those files are not used);
- **θ_t**: a role-``global`` file of the chosen round (or without a round); one claiming a later
  round, two claiming the same round, or one whose output layer is the parties' median with its
  class rows renamed (mrtf.trust.weights) is named and refused.

:func:`select` returns a :class:`Selection`; ``mrtf.refinery.teachers.newest_locals`` /
``newest_global``, ``mrtf.trust.parties.plan_parties`` and ``mrtf.refinery.assess`` all read it.
What behaviour on the target says about the chosen models (relabelled parties, copies that act
alike, parties that share no basin) is checked later, in mrtf.trust.reliability and
mrtf.trust.basin.
"""

from __future__ import annotations

import hashlib
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from mrtf.trust.weights import output_rows, row_renaming, same_layout

#: two files are copies when their weights, as unit vectors, are within NEAR_COPY × the 75th
#: percentile of the pairwise distances among the parties of that architecture (honest parties
#: trained on their own data are never that close; a copy with noise added small enough to keep
#: its behaviour is), and never farther apart than NEAR_COPY_MAX (cosine ≥ 0.99875): many far
#: outliers (random weights) must not make honest parties look close
NEAR_COPY = 0.05
NEAR_COPY_MAX = 0.05
#: two models act as copies on the target when their softmax outputs differ by less than this
#: on average (and their labels agree on every sample): mrtf.refinery.trusted applies it
BEHAVIOUR_COPY = 2e-3
#: θ_t is refused when its class rows, matched to the parties' median rows, move at least
#: RENAME_MOVED × C rows (≥ 3) at ≤ RENAME_COST × the identity's squared distance (the
#: thresholds of mrtf.trust.reliability, set on 54 clean received sets)
RENAME_MOVED = 0.6
RENAME_COST = 0.9
#: at most this many floats (K × D), and at most MAX_PAIRWISE models of one layout, are compared
#: pairwise for near copies; above, only exact copies are found (by a hash: linear in K)
MAX_COMPARE = 50_000_000
MAX_PAIRWISE = 1_000


@dataclass
class FileUse:
    """One received file and what the rule does with it: ``used`` or not and ``why``;
    ``suspicious`` when a claim of the file was refused or it is a copy of another file."""

    file: str
    party: str
    role: str
    round: int | None  # 0-based, as in BundleMeta
    used: bool
    why: str
    suspicious: bool = False


@dataclass
class Selection:
    """The models that count. ``locals_``: S_t (ReceivedModel, file order). ``start``: θ_t or
    None. ``round``: the chosen round (0-based) or None. ``files``: one :class:`FileUse` per
    received model, in order. ``copies``: groups of file names that carry one model.
    ``suspicious``: one line per refused claim or copy group (what the CLI warns)."""

    locals_: list
    start: Any
    round: int | None
    files: list[FileUse]
    copies: list[list[str]] = field(default_factory=list)
    suspicious: list[str] = field(default_factory=list)

    @property
    def not_used(self) -> list[FileUse]:
        return [f for f in self.files if not f.used]


def _party(m: Any) -> str:
    return m.meta.party or m.path.stem


def _round(r: int | None) -> str:
    return "no round" if r is None else f"round {r + 1}"


def flat_weights(state: dict[str, torch.Tensor]) -> torch.Tensor:
    """The floating-point parameters of a state dict as one float64 vector, in key order
    (BatchNorm running statistics and counters left out: they are not learned weights)."""
    parts = [v.detach().double().flatten() for n, v in state.items()
             if v.is_floating_point() and "running_" not in n]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def copy_groups(states: Sequence[dict[str, torch.Tensor]],
                rounds: Sequence[int | None] | None = None) -> list[list[int]]:
    """Groups (≥ 2 indices, each in order) of state dicts that are one model: identical
    tensors, or, among ≥ 3 of one layout, unit weight vectors within :data:`NEAR_COPY` × the
    75th percentile of the pairwise distances among all of that layout (a fraction of the
    distances, so a majority of copies does not hide; at most :data:`NEAR_COPY_MAX`). With
    ``rounds``, only files of one round can be copies (a party's history may repeat a model),
    while the distance scale is taken over every round."""
    rounds = list(rounds) if rounds is not None else [None] * len(states)
    layouts: dict[str, list[int]] = {}
    for i, s in enumerate(states):
        key = repr([(n, tuple(v.shape), str(v.dtype)) for n, v in s.items()])
        layouts.setdefault(key, []).append(i)
    parent = list(range(len(states)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for idx in layouts.values():
        if len(idx) < 2:
            continue
        for a, b in _copy_pairs([states[i] for i in idx]):
            if rounds[idx[a]] == rounds[idx[b]]:
                parent[root(idx[b])] = root(idx[a])
    groups: dict[int, list[int]] = {}
    for i in range(len(states)):
        groups.setdefault(root(i), []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def _copy_pairs(states: Sequence[dict[str, torch.Tensor]]) -> list[tuple[int, int]]:
    """Pairs (i < j) of one layout that are copies (see :func:`copy_groups`)."""
    k = len(states)
    same: dict[bytes, list[int]] = {}
    for i, s in enumerate(states):
        same.setdefault(_digest(s), []).append(i)
    exact = {(g[0], j) for g in same.values() for j in g[1:]}
    if k * sum(v.numel() for v in states[0].values()) > MAX_COMPARE or not 3 <= k <= MAX_PAIRWISE:
        return sorted(exact)
    # unit vectors: a party sending weights × 100 must not make every honest pair look close
    flat = torch.nn.functional.normalize(torch.stack([flat_weights(s) for s in states]), dim=1)
    dist = torch.cdist(flat.float(), flat.float()).numpy()
    upper = dist[np.triu_indices(k, 1)]
    limit = min(NEAR_COPY * float(np.quantile(upper, 0.75)), NEAR_COPY_MAX)
    return sorted(exact | {(i, j) for i in range(k) for j in range(i + 1, k)
                                if dist[i, j] <= limit})


def _digest(state: dict[str, torch.Tensor]) -> bytes:
    """A hash of every tensor's bytes, in key order: equal digests are identical weights."""
    h = hashlib.blake2b(digest_size=20)
    for v in state.values():
        h.update(v.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.digest()


def _weight_copies(locals_r: list) -> list[list[int]]:
    """Copy groups among the models that carry weights (an ONNX graph has no state dict: an
    empty one would make every ONNX party a copy of every other)."""
    held = [i for i, m in enumerate(locals_r) if getattr(m, "onnx", None) is None]
    groups = copy_groups([locals_r[i].state_dict for i in held],
                         [locals_r[i].meta.round for i in held])
    return [[held[j] for j in g] for g in groups]


def _graph_copies(locals_r: list) -> list[list[int]]:
    """ONNX files of one round whose checked graphs are byte for byte the same."""
    same: dict[tuple, list[int]] = {}
    for i, m in enumerate(locals_r):
        if getattr(m, "onnx", None) is not None:
            same.setdefault((m.onnx.sha256, m.meta.round), []).append(i)
    return [g for g in same.values() if len(g) > 1]


def _drop_copies(locals_r: list, files: dict[int, FileUse], suspicious: list[str]
                 ) -> tuple[list, list[list[str]]]:
    """The local models with every copy after a group's first file left out (named). Files of
    different rounds are never copies: a party's history may repeat a model."""
    groups = _weight_copies(locals_r) + _graph_copies(locals_r)
    copies, dropped = [], set()
    for g in groups:
        first = locals_r[g[0]]
        names = [locals_r[i].path.name for i in g]
        copies.append(names)
        suspicious.append(f"{len(g)} files carry one model ({', '.join(names)}): a copy "
                          f"under {len(g)} names counts once ({first.path.name})")
        for i in g[1:]:
            dropped.add(i)
            m = locals_r[i]
            files[id(m)] = FileUse(m.path.name, _party(m), "local", m.meta.round, False,
                                   f"a copy of {first.path.name} ({_party(first)}): the same "
                                   "weights under another name count once", True)
    return [m for i, m in enumerate(locals_r) if i not in dropped], copies


def _pick_round(locals_r: list, files: dict[int, FileUse], suspicious: list[str]
                ) -> int | None:
    """The newest round whose distinct models are a strict majority of the best-attended
    round's; newer rounds' files are refused (named), older ones are not this round's."""
    counts: dict[int, int] = {}
    for m in locals_r:
        if m.meta.round is not None:
            counts[m.meta.round] = counts.get(m.meta.round, 0) + 1
    if not counts:
        return None
    largest = max(counts.values())
    chosen = max(r for r, n in counts.items() if 2 * n > largest)
    for m in locals_r:
        r = m.meta.round
        if r is None or r == chosen:
            continue
        if r > chosen:
            why = (f"claims {_round(r)}, which only {counts[r]} file(s) reach while "
                   f"{largest} parties sent {_round(max(counts, key=counts.get))}: a round "
                   "claim that would leave out most parties is refused")
            suspicious.append(f"{m.path.name} ({_party(m)}) {why}")
            files[id(m)] = FileUse(m.path.name, _party(m), "local", r, False, why, True)
        else:
            files[id(m)] = FileUse(
                m.path.name, _party(m), "local", r, False,
                f"{_round(r)} is older than the newest {_round(chosen)}: only the newest "
                "round's models teach (S_t); FedKF's OCA would use it")
    return chosen


def renamed_start(start_state: dict[str, torch.Tensor], local_states: Sequence[dict],
                  num_classes: int) -> str | None:
    """Why θ_t's output layer is refused (its class rows are the parties' median rows
    renamed), or None. Needs the parties' layout; every honest party trained from θ_t, so its
    rows stay next to θ_t's (mrtf.trust.weights)."""
    if not local_states or not same_layout([start_state, *local_states]):
        return None
    rows = [output_rows(s, num_classes) for s in local_states]
    mine = output_rows(start_state, num_classes)
    if mine is None or any(r is None for r in rows):
        return None
    moved, cost = row_renaming(mine, np.median(np.stack(rows), 0))
    if moved >= max(3, math.ceil(RENAME_MOVED * num_classes)) and cost <= RENAME_COST:
        return (f"its output layer is the parties' median with {moved} of {num_classes} class "
                f"rows swapped ({cost:.2f}× the distance unswapped): not the model they "
                "started from")
    return None


def _pick_start(globals_r: list, chosen: int | None, locals_r: list, num_classes: int,
                files: dict[int, FileUse], suspicious: list[str]) -> Any:
    """θ_t: the chosen round's role-'global' file (else one without a round), checked."""
    def refuse(m: Any, why: str) -> None:
        suspicious.append(f"{m.path.name} ({_party(m)}) {why}")
        files[id(m)] = FileUse(m.path.name, _party(m), "global", m.meta.round, False, why, True)

    same, later, older = [], [], []
    for m in globals_r:
        r = m.meta.round
        (later if chosen is not None and r is not None and r > chosen else
         older if chosen is not None and r is not None and r < chosen else same).append(m)
    for m in later:
        refuse(m, f"claims to be θ_t of {_round(m.meta.round)}, after the parties' newest "
                  f"{_round(chosen)}: refused")
    for m in older:
        files[id(m)] = FileUse(m.path.name, _party(m), "global", m.meta.round, False,
                               f"an older θ_t ({_round(m.meta.round)}); the newest θ_t is used")
    if chosen is None and len(same) > 1:  # no round among the parties: the newest θ_t
        newest = max(same, key=lambda m: -1 if m.meta.round is None else m.meta.round)
        for m in same:
            if m is not newest:
                files[id(m)] = FileUse(m.path.name, _party(m), "global", m.meta.round, False,
                                       f"an older θ_t ({_round(m.meta.round)}); the newest "
                                       "θ_t is used")
        same = [newest]
    exact = [m for m in same if m.meta.round is not None] or same
    for m in same:
        if m not in exact:
            files[id(m)] = FileUse(m.path.name, _party(m), "global", None, False,
                                   f"θ_t without a round; the one of {_round(chosen)} is used")
    if len(exact) > 1:
        for m in exact:
            refuse(m, f"one of {len(exact)} files claiming to be θ_t of "
                      f"{_round(exact[0].meta.round)}: none is trusted as the start")
        return None
    if not exact:
        return None
    start = exact[0]
    why = renamed_start(start.state_dict, [m.state_dict for m in locals_r], num_classes)
    if why is not None:
        refuse(start, why)
        return None
    return start


#: the last selections, by id of the received set (a weak reference tells a reused id apart):
#: the refinery asks several times per run and the copy check compares every pair of weights
_CACHE: dict[int, tuple[Any, tuple[int, ...], Selection]] = {}


def select(received: Any) -> Selection:
    """The one rule for which models of ``received`` (a ReceivedSet) count (module doc)."""
    key = tuple(id(m) for m in received.models)
    hit = _CACHE.get(id(received))
    if hit is not None and hit[0]() is received and hit[1] == key:
        return hit[2]
    out = _select(received)
    if len(_CACHE) > 8:
        _CACHE.clear()
    _CACHE[id(received)] = (weakref.ref(received), key, out)
    return out


def _select(received: Any) -> Selection:
    files: dict[int, FileUse] = {}
    suspicious: list[str] = []
    locals_all = [m for m in received.models if m.meta.role == "local"]
    distinct, copies = _drop_copies(locals_all, files, suspicious)
    chosen = _pick_round(distinct, files, suspicious)
    locals_r = [m for m in distinct if m.meta.round is None or m.meta.round == chosen]
    start = _pick_start([m for m in received.models if m.meta.role == "global"], chosen,
                        locals_r, received.num_classes if received.models else 0, files,
                        suspicious)
    for m in received.models:
        if id(m) in files:
            continue
        if m.meta.role == "refined":
            why, used = "an earlier refined output (role 'refined'), not a party's model", False
        elif m.meta.role == "global":
            why, used = "θ_t, the round's starting model (self-teaching, Eq. 10)", True
        else:
            why, used = f"local model of the newest round ({_round(m.meta.round)}): a " \
                        "teacher (S_t)", True
        files[id(m)] = FileUse(m.path.name, _party(m), m.meta.role, m.meta.round, used, why)
    return Selection(locals_r, start, chosen, [files[id(m)] for m in received.models],
                     copies, suspicious)


def behaviour_copies(logits: np.ndarray) -> list[list[int]]:
    """Groups (≥ 2, in order) of models whose target logits (K, M, C) give the same label on
    every sample and softmax outputs within :data:`BEHAVIOUR_COPY` on average: one model
    under several names, whatever their files say (a copy saved in another architecture or
    with weights permuted)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(-1, keepdims=True)
    labels = p.argmax(2)
    same: dict[bytes, list[int]] = {}  # only models with the same labels can be copies
    for i in range(len(p)):
        same.setdefault(labels[i].tobytes(), []).append(i)
    out = []
    for idx in same.values():
        taken: set[int] = set()
        for a, i in enumerate(idx):
            if i in taken:
                continue
            g = [i] + [j for j in idx[a + 1:] if j not in taken and
                       float(np.abs(p[i] - p[j]).sum(-1).mean()) < BEHAVIOUR_COPY]
            taken.update(g)
            if len(g) > 1:
                out.append(g)
    return sorted(out)


@dataclass
class _Models:
    """A bare list of received models, as :func:`select` reads a ReceivedSet."""

    models: list

    @property
    def num_classes(self) -> int:
        return self.models[0].meta.num_classes


def select_locals(models: Sequence) -> list:
    """S_t among a list of local ReceivedModels, by the rule of :func:`select` (data-free
    fusion's FedFTG teachers)."""
    return select(_Models(list(models))).locals_ if models else []


def latest_per_party(models: Sequence) -> list:
    """The latest received model of each party (highest ``meta.round``; a missing round counts
    as older than any round). Parties are ``meta.party``, else the file name. A party with two
    files of the same round keeps the first in the given order. Order: first appearance."""
    best: dict[str, object] = {}
    for m in models:
        key = m.meta.party or m.path.stem
        old = best.get(key)
        rnd = -1 if m.meta.round is None else m.meta.round
        if old is None or rnd > (-1 if old.meta.round is None else old.meta.round):
            best[key] = m
    return list(best.values())
