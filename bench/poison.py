"""Poisoned parties (issue 13): how much does one bad party cost each method's labels?

Received sets of K=10 parties on mnist5k, Dirichlet 0.5, LeNet, 1,000-image target: one-shot
(1 round, E=20), after 10 FedAvg rounds (E=2, every party every round), and "weak": one round
of one local epoch (batch 16), parties that each name one to three classes (the regime of
bench/scale.py's received sets). Party 0 (or parties 0-2) is replaced by: random N(0, 1)
weights; its weights × 100; a model trained on its data with flipped labels (y + 1 mod 10);
its own model with the output layer's class rows rolled by one ("rolled": the same relabelling
without training); an honest model claiming n_samples = 10^6; a flipped model claiming
n_samples = 10^6 or train_loss = 0; and three flipped parties. The target's y only scores.
Finished cells are cached under ``--out``, so a stopped run loses nothing. The takeover kinds
(issue 35) and the ``one-shot-5*`` settings (Dirichlet 0.5 / 0.1 / IID / an mnistm5k target)
are in docs/benchmarks/takeover.md; ``--report --per-seed`` prints its per-seed tables.

    OMP_NUM_THREADS=1 python bench/poison.py --shard 0/2 &
    OMP_NUM_THREADS=1 python bench/poison.py --shard 1/2 &
    wait; python bench/poison.py --report
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from mrtf.federated import local_train, run_fedavg
from mrtf.federated.runner import RunConfig, prepare_run
from mrtf.io.bundles import ReceivedModel, ReceivedSet
from mrtf.io.hdf5 import ArraySource
from mrtf.models import build_model
from mrtf.refinery import RefineConfig, accuracy_of, refine
from mrtf.trust.selection import select

SETTINGS = {
    "one-shot": RunConfig(dataset="mnist5k", clients=10, split="dirichlet:0.5", ratio=1.0,
                          rounds=1, epochs=20, batch_size=32),
    "10-rounds": RunConfig(dataset="mnist5k", clients=10, split="dirichlet:0.5", ratio=1.0,
                           rounds=10, epochs=2, batch_size=32),
    # the setting of issue 35's takeover table (10 parties, Dirichlet 0.5, 5 epochs, seed 11)
    "one-shot-5": RunConfig(dataset="mnist5k", clients=10, split="dirichlet:0.5", ratio=1.0,
                            rounds=1, epochs=5, batch_size=32),
    # the same on other splits and a cross-domain target (issue 35's takeover kinds over
    # seeds and settings): Dirichlet 0.1, IID, and the target drawn from mnistm5k
    "one-shot-5-d0.1": RunConfig(dataset="mnist5k", clients=10, split="dirichlet:0.1",
                                 ratio=1.0, rounds=1, epochs=5, batch_size=32),
    "one-shot-5-iid": RunConfig(dataset="mnist5k", clients=10, split="iid", ratio=1.0,
                                rounds=1, epochs=5, batch_size=32),
    "one-shot-5-mnistm": RunConfig(dataset="mnist5k", target="mnistm5k", clients=10,
                                   split="dirichlet:0.5", ratio=1.0, rounds=1, epochs=5,
                                   batch_size=32),
    "weak": RunConfig(dataset="mnist5k", clients=10, split="dirichlet:0.5", ratio=1.0,
                      rounds=1, epochs=1, batch_size=16),
}
POISONS = ("clean", "random", "x100", "flipped", "rolled", "claims-1e6", "loss-0",
           "claims-1e6+flipped", "loss-0+flipped", "3-flipped",
           # a reference, not an attack: party 0's file left out (what the nine honest parties
           # give; every kind that replaces party 0's model can at best do this)
           "absent") + (
    # takeovers (issue 35): party 0 rolled, claiming round 10^6; party 0 rolled, posing as θ_t
    # of a later round; party 0 replaced by 5 copies of party 1 under 5 names
    "round-claim", "pose-global", "sybil-5",
    # and two more: θ_t's own file replaced by party 0's rolled model (same round, so no round
    # claim gives it away); party 0 replaced by 5 near-copies (noise at 1e-3 of each tensor's
    # std) of its rolled model under 5 names, all claiming round 10^6 (5 of 14 files: a
    # majority of 9 only if the copies count as 5)
    "fake-start", "sybils-round")
TAKEOVERS = POISONS[-5:]
#: ``fedavg:median`` / ``fedavg:trimmed:0.1``: the parameter average aggregated robustly;
#: ``fedavg+trust``: the average without the parties mrtf.trust excludes (claims checked)
METHODS = ("fedavg", "feddf", "mrtf", "adaptive", "fedavg:median", "fedavg+trust")


def _config(method: str, seed: int) -> RefineConfig:
    base, _, agg = method.partition(":")
    trust = base.endswith("+trust")
    return RefineConfig(method=base.removesuffix("+trust"), seed=seed, progress=False,
                        clr_min_round=0, aggregate=agg or "mean", trust=True if trust else None)
SEEDS = (0, 1, 2)


def _received(sim) -> tuple[ReceivedSet, object]:
    """The last round as the pilot party receives it (in memory, exported metadata)."""
    return sim.received(), sim.last


def _flipped(sim, cfg: RunConfig, k: int, seed: int) -> dict[str, torch.Tensor]:
    """Party k's model trained from θ_t on its own data with labels y + 1 mod C."""
    fed, last = sim.federation, sim.last
    start = build_model(cfg.arch, fed.num_classes, **fed.arch_kwargs)
    start.load_state_dict(last.start_state)
    idx = torch.from_numpy(fed.parts[k])
    y = (fed.y[idx] + 1) % fed.num_classes
    res = local_train(start, fed.x[idx], y, fed.num_classes, cfg.local_config(),
                      seed=seed * 7919 + k)
    return res.model.state_dict()


def rolled_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same model predicting y + 1: its output layer's class rows rolled by one."""
    out = dict(state)
    last = [n for n, v in state.items() if v.dim() == 2][-1]
    for n in (last, last.replace("weight", "bias")):
        out[n] = state[n].roll(1, 0)
    return out


def _copies(m: ReceivedModel, state: dict[str, torch.Tensor], n: int, noise: float,
            rng: torch.Generator, **meta) -> list[ReceivedModel]:
    """``n`` files named sybil-j carrying ``state`` (plus Gaussian noise at ``noise`` × each
    tensor's std) with ``m``'s metadata changed by ``meta``."""
    out = []
    for j in range(n):
        st = {k: v + noise * v.std() * torch.randn(v.shape, generator=rng)
              if noise and v.is_floating_point() and v.numel() > 1 else v.clone()
              for k, v in state.items()}
        out.append(ReceivedModel(m.path.with_name(f"sybil-{j}.safetensors"),
                                 replace(m.meta, party=f"sybil-{j}", **meta), st))
    return out


def takeover(rs: ReceivedSet, poison: str, seed: int) -> tuple[ReceivedSet, set[str]]:
    """A copy of ``rs`` with one of the takeover kinds (TAKEOVERS), and the names of the files
    an attacker added or changed."""
    models = list(rs.models)
    rng = torch.Generator().manual_seed(seed)
    m, other = models[0], models[1]
    if poison == "round-claim":
        models[0] = ReceivedModel(m.path, replace(m.meta, round=10**6 - 1),
                                  rolled_state(m.state_dict))
    elif poison == "pose-global":
        models[0] = ReceivedModel(m.path, replace(m.meta, role="global", round=m.meta.round + 1),
                                  rolled_state(m.state_dict))
    elif poison == "fake-start":
        g = next(i for i, x in enumerate(models) if x.meta.role == "global")
        models[g] = ReceivedModel(models[g].path, models[g].meta, rolled_state(m.state_dict))
        return ReceivedSet(models, []), {models[g].meta.party}
    elif poison == "sybil-5":
        models[0:1] = _copies(other, other.state_dict, 5, 0.0, rng)
    elif poison == "sybils-round":
        models[0:1] = _copies(m, rolled_state(m.state_dict), 5, 1e-3, rng, round=10**6 - 1)
    # sybil-5: the copied party's own file is one of the 6 files of one model (which is the
    # original cannot be told): the group is the attack, all but one file should be named
    bad = {x.meta.party for x in models if x.meta.party.startswith("sybil-")} or \
        {m.meta.party}
    if poison == "sybil-5":
        bad.add(other.meta.party)
    return ReceivedSet(models, []), bad


def poisoned(rs: ReceivedSet, sim, cfg: RunConfig, poison: str, seed: int) -> ReceivedSet:
    """A copy of ``rs`` with party 0 (parties 0-2 for 3-flipped) replaced by ``poison``."""
    if poison in TAKEOVERS:
        return takeover(rs, poison, seed)[0]
    if poison == "absent":
        return ReceivedSet(list(rs.models[1:]), [])
    models = [copy.copy(m) for m in rs.models]
    rng = torch.Generator().manual_seed(seed)
    victims = [0, 1, 2] if poison == "3-flipped" else [0]
    for i in victims:
        m = models[i]
        k = int(m.meta.party.split("-")[1])
        state, meta = dict(m.state_dict), m.meta
        if poison == "random":
            state = {n: torch.randn(v.shape, generator=rng) if v.is_floating_point() else v
                     for n, v in state.items()}
        elif poison == "x100":
            state = {n: v * 100 if v.is_floating_point() else v for n, v in state.items()}
        elif "flipped" in poison:
            state = _flipped(sim, cfg, k, seed)
        elif poison == "rolled":
            state = rolled_state(state)
        if "claims-1e6" in poison:
            counts = list(meta.label_counts or [])
            scale = 10**6 / max(1, sum(counts))
            counts = [int(round(c * scale)) for c in counts]
            meta = replace(meta, n_samples=sum(counts), label_counts=counts)
        if poison.startswith("loss-0"):
            meta = replace(meta, train_loss=0.0)
        models[i] = ReceivedModel(m.path, meta, state)
    return ReceivedSet(models, [])


def run_cell(setting: str, seed: int, root: Path, methods=METHODS, poisons=POISONS
             ) -> list[dict]:
    """Every (poison, method) of one (setting, seed), cached per row."""
    cfg = SETTINGS[setting]
    fed = prepare_run(cfg, seed)
    sim = run_fedavg(cfg, fed, seed=seed)
    rs, _ = _received(sim)
    target = ArraySource(fed.target_x.numpy())
    y = fed.target_y.numpy()
    rows = []
    for poison in poisons:
        prs = None
        for method in methods:
            path = root / f"{setting}-s{seed}-{poison}-{method}.json"
            if path.is_file():
                rows.append(json.loads(path.read_text()))
                continue
            prs = prs or poisoned(rs, sim, cfg, poison, seed)
            t0 = time.perf_counter()
            res = refine(prs, target, _config(method, seed))
            victims = takeover(rs, poison, seed)[1] if poison in TAKEOVERS else set() \
                if poison in ("clean", "absent") else \
                {m.meta.party for m in prs.models[:3 if poison == "3-flipped" else 1]}
            flagged = {p.name for p in (res.parties.parties if res.parties else ())
                       if p.verdict != "trusted"}
            # a refused claim or a copy is named before the checks on the target (selection)
            flagged |= {f.party for f in select(prs).files if f.suspicious}
            row = {"setting": setting, "seed": seed, "poison": poison, "method": method,
                   "accuracy": accuracy_of(res.probs, y),
                   "seconds": time.perf_counter() - t0,
                   "trust": res.consensus.trust if res.consensus else None,
                   "verdicts": res.parties.verdicts if res.parties else None,
                   "novelty": res.novelty.to_dict() if res.novelty else None,
                   "named": sorted(victims & flagged), "false_flags": sorted(flagged - victims)}
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(row, indent=1))
            os.replace(tmp, path)
            rows.append(row)
            print(f"{setting:9s} s{seed} {poison:20s} {method:9s} {row['accuracy']:.3f}",
                  flush=True)
    return rows


def report(root: Path) -> str:
    rows = [json.loads(p.read_text()) for p in sorted(root.glob("*.json"))]
    acc: dict[tuple, list[float]] = {}
    for r in rows:
        acc.setdefault((r["setting"], r["poison"], r["method"]), []).append(r["accuracy"])
    lines = []
    for setting in SETTINGS:  # only the settings, kinds and methods that were run
        methods = [m for m in METHODS if any(k[0] == setting and k[2] == m for k in acc)]
        if not methods:
            continue
        lines += [f"\n**{setting}** (mean over seeds; Δ in points against clean)\n",
                  "| poison | " + " | ".join(methods) + " |",
                  "|---|" + "---|" * len(methods)]
        for poison in [p for p in POISONS if any(k[:2] == (setting, p) for k in acc)]:
            cells = []
            for m in methods:
                v = acc.get((setting, poison, m))
                c = acc.get((setting, "clean", m))
                if not v:
                    cells.append("–")
                    continue
                delta = "" if poison == "clean" or not c else \
                    f" ({100 * (np.mean(v) - np.mean(c)):+.1f})"
                cells.append(f"{np.mean(v):.3f}{delta} [n={len(v)}]")
            lines.append(f"| {poison} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def named_report(root: Path) -> str:
    """Per (setting, poison): in how many seeds the default (adaptive) named every poisoned
    party, and how many clean parties it flagged."""
    rows = [json.loads(p.read_text()) for p in sorted(root.glob("*-adaptive.json"))]
    out = ["\n| setting | poison | named (seeds) | clean parties flagged |", "|---|---|---|---|"]
    for setting in SETTINGS:
        for poison in POISONS:
            rr = [r for r in rows if r["setting"] == setting and r["poison"] == poison
                  and "named" in r]
            if not rr:
                continue
            # sybil-5: 6 files of one model, 5 beyond the first; sybils-round: all 5 refused
            named = sum(len(r["named"]) == _wanted(poison) for r in rr)
            false = sum(len(r["false_flags"]) for r in rr)
            out.append(f"| {setting} | {poison} | {named}/{len(rr)} | {false} |")
    return "\n".join(out)


def _wanted(poison: str) -> int:
    """How many files the default must name for ``poison`` (sybil-5: 6 files of one model, 5
    beyond the first; sybils-round: all 5 copies)."""
    return 0 if poison in ("clean", "absent") else 3 if poison == "3-flipped" else \
        5 if poison in ("sybil-5", "sybils-round") else 1


def seeds_report(root: Path, methods=("fedavg", "mrtf", "adaptive")) -> str:
    """Per setting, one row per poison: each seed's default (adaptive) accuracy and its Δ in
    points against that seed's clean set, the mean Δ of every method, and in how many seeds
    the default named the bad file(s) (and how many clean parties it flagged)."""
    rows = [json.loads(p.read_text()) for p in sorted(root.glob("*.json"))]
    by = {(r["setting"], r["seed"], r["poison"], r["method"]): r for r in rows}
    lines = []
    for setting in SETTINGS:
        seeds = sorted({k[1] for k in by if k[0] == setting and k[3] == "adaptive"})
        if not seeds:
            continue
        head = [f"default s{s}" for s in seeds] + [f"{m} Δ" for m in methods]
        lines += [f"\n**{setting}** (accuracy of the labels; Δ: points against the same "
                  "seed's clean set, mean over seeds)\n",
                  "| poison | " + " | ".join(head) + " | named | clean flagged |",
                  "|---|" + "---|" * (len(head) + 2)]
        for poison in POISONS:
            got = [s for s in seeds if (setting, s, poison, "adaptive") in by]
            if not got:
                continue
            cells = []
            for s in seeds:
                r, c = by.get((setting, s, poison, "adaptive")), \
                    by.get((setting, s, "clean", "adaptive"))
                delta = "" if not r or poison == "clean" or not c else \
                    f" ({100 * (r['accuracy'] - c['accuracy']):+.1f})"
                cells.append(f"{r['accuracy']:.3f}{delta}" if r else "–")
            for m in methods:
                pairs = [(by[(setting, s, poison, m)], by[(setting, s, "clean", m)])
                         for s in seeds if (setting, s, poison, m) in by
                         and (setting, s, "clean", m) in by]
                mean = np.mean([r["accuracy"] for r, _ in pairs]) if pairs else np.nan
                delta = np.mean([r["accuracy"] - c["accuracy"] for r, c in pairs]) \
                    if pairs else np.nan
                cells.append(f"{mean:.3f}" if poison == "clean" else f"{100 * delta:+.1f}")
            rr = [by[(setting, s, poison, "adaptive")] for s in got]
            named = sum(len(r["named"]) == _wanted(poison) for r in rr)
            # (rows of clean sets cached before they had no victims: a flag there is false)
            false = sum(len(r["false_flags"]) + len(r["named"]) * (_wanted(poison) == 0)
                        for r in rr)
            named = "–" if _wanted(poison) == 0 else f"{named}/{len(rr)}"
            lines.append(f"| {poison} | " + " | ".join(cells) + f" | {named} | {false} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/poison")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--shard", default="0/1")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--poisons", default=",".join(POISONS),
                    help="the kinds to run (e.g. clean,round-claim,pose-global)")
    ap.add_argument("--named", action="store_true",
                    help="with --report: which poisoned parties the default named, per cell")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--per-seed", action="store_true",
                    help="with --report: per setting, each seed's default and Δ against clean")
    args = ap.parse_args()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    if args.report:
        print(report(root))
        if args.named:
            print(named_report(root))
        if args.per_seed:
            print(seeds_report(root))
        return
    i, n = map(int, args.shard.split("/"))
    jobs = [(s, int(seed)) for s in args.settings.split(",") for seed in args.seeds.split(",")]
    for j, (setting, seed) in enumerate(jobs):
        if j % n == i:
            run_cell(setting, seed, root, args.methods.split(","), args.poisons.split(","))


if __name__ == "__main__":
    main()
