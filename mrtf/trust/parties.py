"""Which received files a job uses, which it leaves out, and why: said before the work.

A received directory may hold models of several rounds (``--export-history``), a θ_t, an
earlier refined output, or two files under one party name. The refinery and FedFTG teach
with the newest round's local models only (S_t); FedKF's OCA teacher averages each party's
latest model. Nothing is left out quietly: :func:`plan_parties` lists every file with its
verdict, and :func:`duplicate_parties` flags one party name on two files of one round.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from mrtf.trust.selection import latest_per_party, select


@dataclass
class PartyUse:
    """One received file and what the job does with it."""

    file: str
    party: str
    role: str
    round: int | None
    arch: str
    used: bool
    why: str
    suspicious: bool = False  # a refused claim or a copy of another file

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _party(m: Any) -> str:
    return m.meta.party or m.path.stem


def _round(r: int | None) -> str:
    """A 0-based in-memory round as printed (1-based)."""
    return "no round" if r is None else f"round {r + 1}"


def _arch(m: Any) -> str:
    kw = m.meta.arch_kwargs
    shape = f" {kw['in_channels']}×{kw['image_size']}" if {"in_channels", "image_size"} <= set(
        kw) else ""
    return f"{m.meta.arch}{shape}"


def plan_parties(received: Any, job: str) -> list[PartyUse]:
    """Every model of ``received`` with used / not used and why, for ``job`` = ``refine``
    (MrTF and its variants, adaptive), ``fedftg`` or ``fedkf``. The rule is
    :func:`mrtf.trust.selection.select` (round and θ_t claims checked, copies counted once);
    FedKF's OCA teacher takes ``mrtf.trust.selection.latest_per_party`` of the local models."""
    sel = select(received)
    chosen: set[int] = set()
    if job == "fedkf":
        chosen = {id(m) for m in latest_per_party(received.by_role("local"))}
    hetero = len({(m.meta.arch, str(sorted(m.meta.arch_kwargs.items())))
                  for m in sel.locals_}) > 1 or any(m.onnx for m in sel.locals_)
    rows = []
    for m, use in zip(received.models, sel.files):
        used, why = _verdict(m, use, job, chosen, hetero)
        rows.append(PartyUse(m.path.name, _party(m), m.meta.role, m.meta.round_number,
                             _arch(m), used, why, use.suspicious))
    return rows


def _verdict(m: Any, use: Any, job: str, chosen: set[int], hetero: bool) -> tuple[bool, str]:
    if use.suspicious or m.meta.role == "refined":
        return use.used, use.why
    if m.meta.role == "global":
        if job != "refine":
            return False, "θ_t (role 'global'): data-free fusion teaches with local models only"
        if hetero and use.used:
            return False, "θ_t: the newest round's parties differ in architecture, so there " \
                          "is no parameter average and no θ_t"
        return use.used, use.why
    if job == "fedkf":
        if id(m) in chosen:
            return True, f"this party's latest model ({_round(m.meta.round)}): OCA teacher"
        return False, f"an older or repeated file of party {_party(m)} " \
                      f"({_round(m.meta.round)}); OCA averages each party's latest model once"
    return use.used, use.why


def duplicate_parties(received: Any) -> list[str]:
    """One warning per party name carried by two or more local files of the same round: two
    parties under one name, or one file copied twice (it would count twice as a teacher)."""
    groups: dict[tuple[str, int | None], list[str]] = defaultdict(list)
    for m in received.models:
        if m.meta.role == "local":
            groups[(_party(m), m.meta.round)].append(m.path.name)
    return [f"party {name!r} sent {len(files)} files of {_round(r)} ({', '.join(files)}); "
            "each counts as a teacher: remove the copy, or give the parties distinct "
            "mrtf.party names"
            for (name, r), files in groups.items() if len(files) > 1]


def describe(rows: list[PartyUse], shown: int = 8) -> tuple[list[str], list[str]]:
    """(lines to say: who is used, and θ_t / refined files left out by design; warnings: each
    party's model left out and why, at most ``shown`` of them)."""
    used = [r for r in rows if r.used]
    names = ", ".join(sorted({r.party for r in used}))
    say = [f"parties used: {len(used)} of {len(rows)} received files ({names})"]
    say += [f"not used: {r.file}: {r.why}" for r in rows
            if not r.used and r.role != "local" and not r.suspicious]
    left = [r for r in rows if not r.used and (r.role == "local" or r.suspicious)]
    left.sort(key=lambda r: not r.suspicious)  # refused claims and copies first
    warn = [f"not used: {r.file} ({r.party}, {r.arch}): {r.why}" for r in left[:shown]]
    if len(left) > shown:
        warn.append(f"not used: {len(left) - shown} more party files (`mrtf inspect` lists "
                    "them)")
    return say, warn
