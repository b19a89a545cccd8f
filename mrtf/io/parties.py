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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _party(m: Any) -> str:
    return m.meta.party or m.path.stem


def _round(r: int | None) -> str:
    """A 0-based in-memory round as printed (1-based)."""
    return "no round" if r is None else f"round {r + 1}"


def _newest(models: list) -> int | None:
    rounds = [m.meta.round for m in models if m.meta.round is not None]
    return max(rounds) if rounds else None


def _arch(m: Any) -> str:
    kw = m.meta.arch_kwargs
    shape = f" {kw['in_channels']}×{kw['image_size']}" if {"in_channels", "image_size"} <= set(
        kw) else ""
    return f"{m.meta.arch}{shape}"


def plan_parties(received: Any, job: str) -> list[PartyUse]:
    """Every model of ``received`` with used / not used and why, for ``job`` = ``refine``
    (MrTF and its variants, adaptive), ``fedftg`` or ``fedkf``. Mirrors the selection of
    ``mrtf.refinery.pipeline.newest_locals`` and ``mrtf.datafree.fedkf.latest_per_party``."""
    locals_ = [m for m in received.models if m.meta.role == "local"]
    newest = _newest(locals_)
    chosen: set[int] = set()
    if job == "fedkf":
        from mrtf.datafree.fedkf import latest_per_party

        chosen = {id(m) for m in latest_per_party(locals_)}
    glob = [m for m in received.models if m.meta.role == "global"]
    hetero = len({(m.meta.arch, str(sorted(m.meta.arch_kwargs.items())))
                  for m in locals_ if newest is None or m.meta.round in (None, newest)}) > 1 \
        or any(m.onnx for m in locals_)
    newest_glob = max(glob, key=lambda m: -1 if m.meta.round is None else m.meta.round,
                      default=None)
    rows = []
    for m in received.models:
        used, why = _verdict(m, job, newest, chosen, hetero, newest_glob)
        rows.append(PartyUse(m.path.name, _party(m), m.meta.role, m.meta.round_number,
                             _arch(m), used, why))
    return rows


def _verdict(m: Any, job: str, newest: int | None, chosen: set[int], hetero: bool,
             newest_glob: Any) -> tuple[bool, str]:
    r = m.meta.round
    if m.meta.role == "refined":
        return False, "an earlier refined output (role 'refined'), not a party's model"
    if m.meta.role == "global":
        if job != "refine":
            return False, "θ_t (role 'global'): data-free fusion teaches with local models only"
        if hetero:
            return False, "θ_t: the newest round's parties differ in architecture, so there " \
                          "is no parameter average and no θ_t"
        if m is not newest_glob:
            return False, f"an older θ_t ({_round(r)}); the newest θ_t is used"
        return True, "θ_t, the round's starting model (self-teaching, Eq. 10)"
    if job == "fedkf":
        if id(m) in chosen:
            return True, f"this party's latest model ({_round(r)}): OCA teacher"
        return False, f"an older or repeated file of party {_party(m)} ({_round(r)}); OCA " \
                      "averages each party's latest model once"
    if r is None or newest is None or r == newest:
        return True, f"local model of the newest round ({_round(r)}): a teacher (S_t)"
    return False, f"{_round(r)} is older than the newest {_round(newest)}: only the newest " \
                  "round's models teach (S_t); FedKF's OCA would use it"


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
    say += [f"not used: {r.file}: {r.why}" for r in rows if not r.used and r.role != "local"]
    left = [r for r in rows if not r.used and r.role == "local"]
    warn = [f"not used: {r.file} ({r.party}, {r.arch}): {r.why}" for r in left[:shown]]
    if len(left) > shown:
        warn.append(f"not used: {len(left) - shown} more party files (`mrtf inspect` lists "
                    "them)")
    return say, warn
