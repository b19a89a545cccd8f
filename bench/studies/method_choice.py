"""Could the labels choose their method? (not adopted; docs/benchmarks/label-quality.md)

The class prior is chosen per target by how well each prior's labels follow the target's own
neighbourhoods (mrtf/refinery/prior_choice.py). This asks whether the same label-free test
can choose between whole methods per target: the default (adaptive), paper MrTF, FedDF, the
ensemble, and the default forced down its other branch (vote where it adapts, adapt where it
votes). Per cell it keeps each method's labels (``--out``/<cell>.npz, with y and the target's
neighbourhoods), then ``--report`` scores every rule: among a candidate set, keep the
default unless another's criterion is higher by a margin; criteria: the raw share of
neighbours with the same label, that share minus the chance agreement of the labels'
histogram (Σ share²), and the kappa of the two. y only scores.

    # --cells default: runs/label_quality/received,runs/fresh/received (label_quality.py's)
    OMP_NUM_THREADS=1 python bench/studies/method_choice.py --shard 0/2 &
    OMP_NUM_THREADS=1 python bench/studies/method_choice.py --shard 1/2 &
    wait; python bench/studies/method_choice.py --report
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: harness and the benchmarks

import label_quality as lq  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from mrtf.trust.neighbours import label_consistency  # noqa: E402

METHODS = ("adaptive", "mrtf", "feddf", "ensemble", "adaptive-learned", "adaptive-uniform")
#: candidate sets: the first is the one kept unless another is clearly better
CANDIDATES = (("adaptive", "mrtf"), ("adaptive", "other"), ("adaptive", "mrtf", "other"),
              ("adaptive", "mrtf", "feddf", "ensemble", "other"),
              ("adaptive-learned", "adaptive-uniform"))
MARGINS = (0.0, 0.01, 0.02)


def dump(cells: list[Path], out: Path, shard: tuple[int, int]) -> None:
    from mrtf.io import H5Dataset, load_received
    from mrtf.trust.neighbours import target_neighbours

    out.mkdir(parents=True, exist_ok=True)
    for j, cell in enumerate(cells):
        path = out / f"{cell.name}.npz"
        if j % shard[1] != shard[0] or path.is_file():
            continue
        seed = int(cell.name.rsplit("-s", 1)[1])
        rs, t0, labels = load_received(cell / "received"), time.perf_counter(), {}
        with H5Dataset(cell / "target.h5") as src:
            for m in METHODS:
                torch.manual_seed(seed)
                labels[m] = lq.METHODS[m](rs, src, seed)[0].argmax(1)
            torch.manual_seed(seed)
            with lq.other_branch():
                labels["other"] = lq.METHODS["adaptive"](rs, src, seed)[0].argmax(1)
            y, nb = src.labels(), target_neighbours(src)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, y=y, nb=nb, **labels)
        tmp.replace(path)
        print(cell.name, {m: round(float((v == y).mean()), 3) for m, v in labels.items()},
              f"{time.perf_counter() - t0:.0f} s", flush=True)


def criterion(labels: np.ndarray, nb: np.ndarray, kind: str) -> float:
    agree = float(label_consistency(labels, nb).mean())
    share = np.bincount(labels) / len(labels)
    chance = float((share ** 2).sum())
    return {"raw": agree, "cc": agree - chance,
            "kappa": (agree - chance) / max(1e-12, 1 - chance)}[kind]


def report(out: Path) -> None:
    data = {f.stem: dict(np.load(f)) for f in sorted(out.glob("*.npz"))}
    groups = {"grid (26 cells)": [k for k in data if k.rsplit("-s", 1)[0] not in lq.FRESH],
              "fresh (27 cells)": [k for k in data if k.rsplit("-s", 1)[0] in lq.FRESH]}
    for name, keys in groups.items():
        acc = {k: {m: float((data[k][m] == data[k]["y"]).mean()) for m in (*METHODS, "other")}
               for k in keys}
        print(f"\n{name}: " + ", ".join(f"{m} {np.mean([acc[k][m] for k in keys]):.3f}"
                                        for m in (*METHODS, "other")))
        print("| candidates | criterion | margin | mean | first alone | oracle | better | "
              "worse |\n|---|---|---|---|---|---|---|---|")
        for cands in CANDIDATES:
            for kind in ("raw", "cc", "kappa"):
                for margin in MARGINS:
                    got, wins, losses = [], 0, 0
                    for k in keys:
                        score = {m: criterion(data[k][m], data[k]["nb"], kind) for m in cands}
                        pick = cands[0]
                        for m in cands[1:]:
                            pick = m if score[m] > score[pick] + margin else pick
                        got.append(acc[k][pick])
                        wins += acc[k][pick] > acc[k][cands[0]]
                        losses += acc[k][pick] < acc[k][cands[0]]
                    first = np.mean([acc[k][cands[0]] for k in keys])
                    oracle = np.mean([max(acc[k][m] for m in cands) for k in keys])
                    print(f"| {' / '.join(cands)} | {kind} | {margin:.2f} | {np.mean(got):.3f} "
                          f"| {first:.3f} | {oracle:.3f} | {wins} | {losses} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="runs/label_quality/received,runs/fresh/received",
                    help="folders of cached cells (<cell>-s<seed>/received, target.h5)")
    ap.add_argument("--out", default="runs/method_choice")
    ap.add_argument("--shard", default="0/1")
    ap.add_argument("--report", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    if args.report:
        report(out)
        return
    cells = sorted(d.parent for r in args.cells.split(",") for d in Path(r).glob("*/received"))
    i, n = map(int, args.shard.split("/"))
    dump(cells, out, (i, n))


if __name__ == "__main__":
    main()
