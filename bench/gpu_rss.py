"""The 1M refine's peak RSS on a GPU under allocator and thread settings (issue 36: < 2 GiB).

One tiled target set and one set of parties (bench/scale.py's) per M; each variant is one
``mrtf refine --stream on`` in a fresh child, sampled by rss_timeline.py, with the memory at
each stage's end (stage_memory.py). A variant is a name and the environment it adds:

    base      OMP_NUM_THREADS=--threads, as bench/scale.py --e2e runs it
    cpu       the same with CUDA hidden (CUDA_VISIBLE_DEVICES=""): the CUDA build's CPU path
    threads2  OMP_NUM_THREADS=2
    arena2    MALLOC_ARENA_MAX=2 (glibc: two malloc arenas instead of 8 per core)
    mmap      MALLOC_MMAP_THRESHOLD_=1048576 (glibc: blocks of >= 1 MiB always mapped, and so
              given back when freed; the threshold no longer rises with the blocks freed)
    trim      malloc_trim(0) at each stage's end (stage_memory.py --trim)
    lean      arena2 + mmap

    python bench/gpu_rss.py --M 20000 --variants base cpu arena2 --out runs/gpu/rss.json

Cells are cached under ``--dir`` (``rss-M*-VARIANT.json``): a finished one is not run again.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from scale import _commit, received_parties, refine_once, tiled_h5, tiled_labels

VARIANTS: dict[str, dict[str, str]] = {
    "base": {},
    "cpu": {"CUDA_VISIBLE_DEVICES": ""},
    "threads2": {"OMP_NUM_THREADS": "2"},
    "arena2": {"MALLOC_ARENA_MAX": "2"},
    "mmap": {"MALLOC_MMAP_THRESHOLD_": "1048576"},
    "trim": {"SCALE_TRIM": "1"},
    "lean": {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "1048576"},
}


def run_variant(root: Path, m: int, k: int, threads: int, name: str) -> dict:
    """One refine of the tiled set under variant ``name``: wall, stages, peak and its parts,
    the memory at each stage's end, and the labels' accuracy."""
    from mrtf.io.labels import read_labels

    h5 = tiled_h5(root / f"mnist5k-tiled-{m}.h5", m)
    parties = received_parties(root, k)
    out = root / f"out-rss-M{m}-{name}"
    extra = {"OMP_NUM_THREADS": str(threads), "SCALE_STAGES": "1", "SCALE_TRIM": "0",
             **VARIANTS[name]}
    summary, wall = refine_once(parties, h5, out, "adaptive", extra)
    labels = read_labels(out / "labels.h5").labels
    for p in out.iterdir():
        p.unlink()
    out.rmdir()
    mem = summary["memory"]
    return {"M": m, "K": k, "threads": threads, "variant": name, "env": VARIANTS[name],
            "commit": _commit(), "wall_s": round(wall, 2), "timings": summary["timings"],
            "peak": mem["peak"], "stages": mem["stages"],
            "accuracy": float((labels == tiled_labels(m)).mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--M", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--K", type=int, default=10)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--variants", nargs="+", default=["base", "lean"], choices=list(VARIANTS))
    ap.add_argument("--dir", default="/tmp/scale")
    ap.add_argument("--out", default="runs/gpu/rss.json")
    args = ap.parse_args()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for m in args.M:
        for name in args.variants:
            cell = root / f"rss-M{m}-{name}.json"
            if not cell.exists():
                t0 = time.perf_counter()
                cell.write_text(json.dumps(run_variant(root, m, args.K, args.threads, name)))
                print(f"  ({time.perf_counter() - t0:.0f} s with its start)", flush=True)
            r = json.loads(cell.read_text())
            rows.append(r)
            p = r["peak"]
            print(f"M={m} {name:9s} wall {r['wall_s']:5.1f}s peak {p['VmRSS']:6.0f} MB (anon "
                  f"{p['RssAnon']:.0f} file {p['RssFile']:.0f} shm {p['RssShmem']:.0f}) at "
                  f"{p['t']:.1f}s acc {r['accuracy']:.4f}", flush=True)
            print("    stage ends: " + "  ".join(
                f"{s['stage']} {s['s']:.1f}s {s['VmRSS']:.0f}/{s['RssAnon']:.0f}"
                for s in r["stages"] or ()), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
