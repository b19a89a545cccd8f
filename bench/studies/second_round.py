"""A second refinement round on the default's voted labels (docs/benchmarks/label-quality.md): each
received set of the label-quality grid and the fresh scenarios refined by the default as it
was before its adapted model was settled (``r1``; mrtf/refinery/fit.py's settle switched off
here), then a model distilled again (500 steps, input jitter, seed + 1000) to the voted
probabilities and voted again; ``cont`` starts from the refined model, ``restart`` from
θ_{t+1}. On the sets the default adapts, ``cont`` is what today's default does (settle); on
the others the second round was not adopted. ``--holdout`` runs the same on 15 sets the
choice was not made on (seeds 3-5 of five cross-domain scenarios, simulated once into
runs/holdout). y only scores. One JSON per set under ``--out``, so a stopped run loses
nothing::

    OMP_NUM_THREADS=1 python bench/studies/second_round.py --shard 0/2 &   # ~18 s a set
    OMP_NUM_THREADS=1 python bench/studies/second_round.py --shard 1/2
    python bench/studies/second_round.py --report
    OMP_NUM_THREADS=1 python bench/studies/second_round.py --holdout --shard i/2   # ~30-100 s a set
    python bench/studies/second_round.py --holdout --report
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: harness and the benchmarks

import numpy as np  # noqa: E402
import torch  # noqa: E402

from mrtf.io import H5Dataset, load_received  # noqa: E402
from mrtf.refinery import RefineConfig, refine  # noqa: E402
from mrtf.refinery.distill import distill  # noqa: E402
from mrtf.refinery.neighbour_vote import final_probs  # noqa: E402

SETS = ("runs/label_quality/received", "runs/fresh/received")
#: the held-out check of the settling: scenarios where the default adapts, new seeds
HOLDOUT = [(cell, seed) for seed in (3, 4, 5)
           for cell in ("mnist5k-to-mnistm5k", "mnist5k-to-mnistm5k-T100",
                        "digits-to-mnist5k-T100", "mnist5k-to-mnistm5k-T200",
                        "digits-to-mnist5k-T200")]


def all_sets() -> list[Path]:
    """The cached received sets of the grid and the fresh scenarios (bench/label_quality.py)."""
    return [d for root in SETS for d in sorted(Path(root).glob("*-s[0-9]"))]


def holdout_sets() -> list[Path]:
    """HOLDOUT's received sets, simulated on first use (as bench/label_quality.py does)."""
    from harness import received_set

    return [received_set(c, s, Path("runs/holdout"))[0].parent for c, s in HOLDOUT]


@contextmanager
def unsettled() -> Iterator[None]:
    """Within: the default as it was before fit.settle (the adapted model kept as SHOT left it)."""
    import mrtf.refinery.fit as fit

    orig = fit.settle
    fit.settle = lambda adapted, *_a, **_k: adapted
    try:
        yield
    finally:
        fit.settle = orig


def one(where: Path) -> dict:
    """The set's labels after the default (r1) and after each second round."""
    seed = int(where.name.rsplit("-s", 1)[1])
    cfg = RefineConfig(seed=seed, progress=False)
    with H5Dataset(where / "target.h5") as src:
        y = src.labels()
        rs = load_received(where / "received")
        with unsettled():
            first = refine(rs, src, cfg)
        row = {"r1": float((first.probs.argmax(1) == y).mean()),
               "adapted": bool(first.novelty is not None and first.novelty.adapt)}
        theta = refine(rs, src, RefineConfig(method="fedavg", progress=False)).model
        for name, start in (("cont", first.model), ("restart", theta)):
            model = distill(copy.deepcopy(start), src, first.probs.astype(np.float32),
                            replace(cfg.distill_run(), seed=seed + 1000), torch.device("cpu"))
            probs, _ = final_probs(model, src, cfg.vote_k)
            row[name] = float((probs.argmax(1) == y).mean())
    return row


def groups(out: Path) -> Iterator[tuple[str, list[dict]]]:
    """The rows under ``out``, the grid's and the fresh sets' apart (those with any)."""
    rows = {f.stem: json.loads(f.read_text()) for f in sorted(out.glob("*.json"))}
    for group in ("label_quality", "fresh", "holdout"):
        r = [v for k, v in rows.items() if k.startswith(group)]
        if r:
            yield group, r


def report(out: Path) -> None:
    for group, r in groups(out):
        a = np.array([[v["r1"], v["cont"], v["restart"]] for v in r])
        for j, name in ((1, "cont"), (2, "restart")):
            d = a[:, j] - a[:, 0]
            print(f"{group} ({len(r)} sets) {name}: {a[:, 0].mean():.4f} → {a[:, j].mean():.4f} "
                  f"({100 * d.mean():+.2f} points; better in {(d > 0).sum()}, worse in "
                  f"{(d < 0).sum()}, {100 * d.min():+.1f} to {100 * d.max():+.1f})")
        adapted = np.array([v["adapted"] for v in r])
        if adapted.any():  # where cont is today's settle
            d = a[adapted, 1] - a[adapted, 0]
            print(f"  the {adapted.sum()} adapted sets, cont: {a[adapted, 0].mean():.4f} → "
                  f"{a[adapted, 1].mean():.4f} ({100 * d.mean():+.2f} points; better in "
                  f"{(d > 0).sum()}, worse in {(d < 0).sum()})")


def run(doc: str, default_out: str, one: Callable[[Path], dict],
        report: Callable[[Path], None]) -> None:
    """The command line both studies share: ``one(set)`` per set, a JSON each under --out
    (a stopped run loses nothing), --shard i/n, --report."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(default_out))
    ap.add_argument("--shard", default="0/1", help="i/n: this process takes every n-th set")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--holdout", action="store_true", help="HOLDOUT's sets instead")
    a = ap.parse_args()
    if a.holdout:
        a.out = a.out.with_name(a.out.name + "-holdout")
    if a.report:
        return report(a.out)
    i, n = map(int, a.shard.split("/"))
    a.out.mkdir(parents=True, exist_ok=True)
    for j, where in enumerate(holdout_sets() if a.holdout else all_sets()):
        f = a.out / f"{where.parent.parent.name}-{where.name}.json"
        if j % n != i or f.is_file():
            continue
        t0 = time.perf_counter()
        row = one(where)
        f.write_text(json.dumps(row))
        print(f"{f.stem} {row} ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    run(__doc__, "runs/second_round", one, report)
