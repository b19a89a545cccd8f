"""The cluster view and the refine seed (session 28): how much of the spread between refine seeds
is the cluster view's k-means start, and do variants of the view that lean less on one start
give better labels?

The adaptive default's cluster view (``mrtf/refinery/adaptive.py``, ``Clusters``) is one
spherical k-means of θ_{t+1}'s features into 2C clusters, started from the refine seed. The
variants, patched in for the study only:

- ``fixed``: the k-means seed held at 0 (everything else follows the refine seed);
- ``views5``: five k-means starts, each one view counting λ/5 in the consensus;
- ``avg5``: five consensus runs, one k-means start each, their posteriors averaged;
- ``more5``: one view of 5C clusters instead of 2C.

Each set is refined at its seed and seed + 100 (``--offsets``); y only scores::

    cd bench/studies
    OMP_NUM_THREADS=1 python cluster_view_size.py --variant more5 --out OUT/more5.json \\
        --grid RECEIVED_DIR [--grid ...] --part 0/2 &
    OMP_NUM_THREADS=1 python cluster_view_size.py --variant more5 --out OUT/more5.json.1 \\
        --grid RECEIVED_DIR [--grid ...] --part 1/2
    python cluster_view_size.py --report OUT/default.json* --against OUT/more5.json*

A RECEIVED_DIR holds ``<set>/received`` and ``<set>/target.h5`` (bench/harness.py's
``received_set``); a set's seed is the number its name ends with.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mrtf.refinery import adaptive  # noqa: E402
from mrtf.refinery.cluster import one_hot  # noqa: E402
from mrtf.refinery.votes import MemoryModelVotes  # noqa: E402

VARIANTS = ("default", "fixed", "views5", "avg5", "more5")
STARTS = 5


def _clusterings(clusters: adaptive.Clusters, n: int, factor: int = 2) -> list:
    """``n`` k-means starts of the view (seeds seed, seed + 1000, ...), made once."""
    if clusters._made is None:
        clusters._made = [clusters.make(clusters.features, factor * clusters.c,
                                        clusters.seed + 1000 * k,
                                        backend=adaptive.choose_backend(clusters.device))
                          for k in range(n)]
    return clusters._made


def _one_prior(variant: str):
    """adaptive._one_prior with the variant's cluster view (the in-memory path only)."""
    def run(store, stats, inputs, live, dead, clusters, class_prior):
        strength = adaptive.strength_of_counts(stats.counts, live) \
            if class_prior == "uniform" else 0.0
        votes = store.model_votes(live, strength, stats)
        nl, w = adaptive.model_weights(live, store.sources, inputs.num_local,
                                       inputs.source_weights)
        models = adaptive.measured_consensus(votes, nl, w, inputs.device)
        conf = models.mean_max_posterior
        lam = adaptive.cluster_weight(conf) if clusters.usable else 0.0
        final, post = models, models.posterior
        if lam > 0:
            assert isinstance(votes, MemoryModelVotes), "the study patches the in-memory path"
            made = _clusterings(clusters, STARTS)
            if variant == "views5":
                many = MemoryModelVotes(votes.models, None)
                many.views = votes.models + [one_hot(a, n) for a, n in made]
                final = adaptive.measured_consensus(many, nl, w + [lam / STARTS] * STARTS,
                                                    inputs.device)
                post = final.posterior
            else:  # avg5
                outs = [adaptive.measured_consensus(votes.with_clusters(a, n), nl, w + [lam],
                                                    inputs.device) for a, n in made]
                final, post = outs[0], np.mean([o.posterior for o in outs], axis=0)
        sources = adaptive.source_report(final, [inputs.names[i] for i in live], w,
                                         store.classes, conf, lam,
                                         clusters.features is not None)
        return adaptive.AdaptiveTargets(post.astype(np.float32), sources + dead, conf, lam,
                                        final, strength)
    return run


def install(variant: str) -> None:
    """Patch the adaptive default's cluster view for ``variant`` (VARIANTS)."""
    if variant in ("fixed", "more5"):
        seed_of = (lambda c: 0) if variant == "fixed" else (lambda c: c.seed)
        factor = 5 if variant == "more5" else 2

        def get(self):
            if self._made is None:
                self._made = self.make(self.features, factor * self.c, seed_of(self),
                                       backend=adaptive.choose_backend(self.device))
            return self._made
        adaptive.Clusters.get = get
    elif variant in ("views5", "avg5"):
        adaptive._one_prior = _one_prior(variant)


def refine_all(grids: list[Path], out: Path, offsets: list[int],
               part: tuple[int, int]) -> None:
    """Accuracy of the default's labels for every set at each seed offset (cached in out)."""
    from mrtf.io import H5Dataset, load_received
    from mrtf.refinery import RefineConfig, refine

    dirs = [d for g in grids for d in sorted(g.glob("*/received"))]
    for j, d in enumerate(dirs):
        key = f"{d.parent.parent.parent.name}/{d.parent.name}"
        res = json.loads(out.read_text()) if out.is_file() else {}
        if j % part[1] != part[0] or key in res:
            continue
        seed = int(d.parent.name.rsplit("-s", 1)[-1])
        accs = []
        with H5Dataset(d.parent / "target.h5") as src:
            y = src.labels()
            rs = load_received(d)
            for off in offsets:
                r = refine(rs, src, RefineConfig(seed=seed + off, progress=False))
                accs.append(float((r.probs.argmax(1) == y).mean()))
        res[key] = accs
        out.write_text(json.dumps(res, indent=0))
        print(key, " ".join(f"{a:.3f}" for a in accs), flush=True)


def report(base: list[Path], variant: list[Path]) -> None:
    """Per group of sets (the received dir's parent name): mean accuracy, Δ, sets better /
    worse by more than a point, and the mean move between the first two seeds."""
    def read(paths):
        return {k: v for p in paths for k, v in json.loads(p.read_text()).items()}
    a, b = read(base), read(variant)
    keys = sorted(set(a) & set(b))
    for group in sorted({k.split("/")[0] for k in keys}) + [None]:
        ks = [k for k in keys if group is None or k.startswith(group + "/")]
        ma = np.array([np.mean(a[k]) for k in ks])
        mb = np.array([np.mean(b[k]) for k in ks])
        d = 100 * (mb - ma)
        move = [100 * np.mean([abs(x[k][1] - x[k][0]) for k in ks]) if all(
            len(x[k]) > 1 for k in ks) else float("nan") for x in (a, b)]
        print(f"{group or 'all'}: n {len(ks)}, {ma.mean():.3f} → {mb.mean():.3f} "
              f"(Δ {d.mean():+.2f} points), better / worse by > 1: {int((d > 1).sum())} / "
              f"{int((d < -1).sum())}, min {d.min():+.1f}, max {d.max():+.1f}; mean seed move "
              f"{move[0]:.1f} → {move[1]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=VARIANTS, default="default")
    ap.add_argument("--grid", type=Path, action="append", default=[])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--offsets", default="0,100", help="refine seeds: the set's seed + these")
    ap.add_argument("--part", default="0/1", help="i/n: this process refines every n-th set")
    ap.add_argument("--report", type=Path, nargs="*", default=None,
                    help="the default's JSON files (with --against: the variant's)")
    ap.add_argument("--against", type=Path, nargs="*", default=[])
    a = ap.parse_args()
    if a.report is not None:
        report(a.report, a.against)
        return
    install(a.variant)
    i, n = map(int, a.part.split("/"))
    refine_all(a.grid, a.out, [int(x) for x in a.offsets.split(",")], (i, n))


if __name__ == "__main__":
    main()
