"""How far the default moves with its own refine seed, against how far a poisoning kind moves
it (issue 35: an honest party claiming 10⁶ samples cost 5.2 points on one-shot-5-mnistm seed
12 in bench/poison.py, which refines each set once, at the federation's seed).

Each (federation seed, kind) of a bench/poison.py setting is refined by the default at
``--refine-seeds`` seeds (the federation's seed + 100 k); the labels are scored against y.
One JSON per refine under ``--out`` (a stop loses nothing); ``--report`` prints, per
federation seed and kind, the mean, the range, and the mean's difference from clean::

    cd bench/studies
    OMP_NUM_THREADS=1 python refine_seed_spread.py --out OUT --seeds 11 &
    OMP_NUM_THREADS=1 python refine_seed_spread.py --out OUT --seeds 12,13
    python refine_seed_spread.py --out OUT --report

``--ensemble SETTING:SEED`` instead refines one clean federation at 9 refine seeds and scores
their labels alone, three ensembles of 3 (the summed probabilities of seeds k = 0-2, 3-5,
6-8) and the ensemble of all 9 (one JSON ``ensemble-SETTING-sSEED.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: poison.py

import numpy as np  # noqa: E402
from poison import SETTINGS, _config, _received, poisoned, prepare_run, run_fedavg  # noqa: E402

from mrtf.io.hdf5 import ArraySource  # noqa: E402
from mrtf.refinery import accuracy_of, refine  # noqa: E402


def federation(setting: str, seed: int):
    """bench/poison.py's federation: (its config, the simulation, the received set, the
    target, its y)."""
    cfg = SETTINGS[setting]
    fed = prepare_run(cfg, seed)
    sim = run_fedavg(cfg, fed, seed=seed)
    received, _ = _received(sim)
    return cfg, sim, received, ArraySource(fed.target_x.numpy()), fed.target_y.numpy()


def run(out: Path, setting: str, seed: int, kinds: list[str], refine_seeds: int) -> None:
    """Refine each kind of one federation at ``refine_seeds`` seeds; cached per refine."""
    cfg, sim, received, target, y = federation(setting, seed)
    for kind in kinds:
        parties = poisoned(received, sim, cfg, kind, seed)
        for k in range(refine_seeds):
            path = out / f"{setting}-s{seed}-{kind}-r{k}.json"
            if path.exists():
                continue
            t0 = time.perf_counter()
            res = refine(parties, target, _config("adaptive", seed + 100 * k))
            row = {"setting": setting, "seed": seed, "kind": kind,
                   "refine_seed": seed + 100 * k, "accuracy": accuracy_of(res.probs, y),
                   "branch": res.branch.to_dict() if res.branch else None,
                   "seconds": time.perf_counter() - t0}
            path.write_text(json.dumps(row))
            print(f"{setting} s{seed} {kind:12s} r{k} {row['accuracy']:.3f}", flush=True)


def ensembles(out: Path, setting: str, seed: int) -> dict:
    """The default at 9 refine seeds on one clean federation: each alone, three ensembles of
    3 (summed probabilities), the ensemble of 9."""
    _, _, received, target, y = federation(setting, seed)
    probs = [refine(received, target, _config("adaptive", seed + 100 * k)).probs
             for k in range(9)]
    row = {"setting": setting, "seed": seed,
           "single": [accuracy_of(p, y) for p in probs],
           "ensembles_of_3": [accuracy_of(sum(probs[i:i + 3]), y) for i in (0, 3, 6)],
           "ensemble_of_9": accuracy_of(sum(probs), y)}
    (out / f"ensemble-{setting}-s{seed}.json").write_text(json.dumps(row))
    return row


def report(out: Path) -> str:
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))
            if not p.name.startswith("ensemble-")]
    acc: dict[tuple, list[float]] = {}
    for r in rows:
        acc.setdefault((r["setting"], r["seed"], r["kind"]), []).append(r["accuracy"])
    lines = ["| setting | seed | kind | refines | mean | min - max | mean Δ vs clean |",
             "|---|---|---|---|---|---|---|"]
    order = sorted(acc.items(), key=lambda kv: (kv[0][:2], kv[0][2] != "clean"))
    for (setting, seed, kind), v in order:
        clean = acc.get((setting, seed, "clean"))
        delta = "–" if kind == "clean" or not clean else \
            f"{100 * (np.mean(v) - np.mean(clean)):+.1f}"
        lines.append(f"| {setting} | {seed} | {kind} | {len(v)} | {np.mean(v):.3f} | "
                     f"{min(v):.3f} - {max(v):.3f} | {delta} |")
    ens = [json.loads(p.read_text()) for p in sorted(out.glob("ensemble-*.json"))]
    if ens:
        lines += ["", "| setting | seed | 9 refines alone: mean (min - max) | ensembles of 3 "
                  "| ensemble of 9 |", "|---|---|---|---|---|"]
    for r in ens:
        one = r["single"]
        lines.append(f"| {r['setting']} | {r['seed']} | {np.mean(one):.3f} ({min(one):.3f} - "
                     f"{max(one):.3f}) | " + " / ".join(f"{a:.3f}" for a in r["ensembles_of_3"])
                     + f" | {r['ensemble_of_9']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--setting", default="one-shot-5-mnistm", choices=sorted(SETTINGS))
    ap.add_argument("--seeds", default="11,12,13")
    ap.add_argument("--kinds", default="clean,claims-1e6,absent")
    ap.add_argument("--refine-seeds", type=int, default=10)
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--ensemble", metavar="SETTING:SEED", action="append",
                    help="seed ensembles of the default on a clean federation (repeatable)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.report:
        print(report(out))
        return
    for spec in args.ensemble or ():
        setting, seed = spec.rsplit(":", 1)
        print(json.dumps(ensembles(out, setting, int(seed))), flush=True)
    if args.ensemble:
        return
    for seed in map(int, args.seeds.split(",")):
        run(out, args.setting, seed, args.kinds.split(","), args.refine_seeds)


if __name__ == "__main__":
    main()
