"""OCA vs ACA (FedKF's Fig. 8 claim) from the run directories of `mrtf simulate` runs that
include the ``fedkf`` method: final-round accuracy on the target set and, when the run held out
local test parts (``local_test``), AMP / WLP, mean ± std over seeds.

    python bench/oca_vs_aca.py runs/fedavg-t1-ratio-0.05 runs/fedavg-t1-ratio-0.2 ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def final_rows(run_dir: Path) -> list[dict]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    last: dict[int, dict] = {}
    for r in recs:
        if r["method"] == "fedkf" and r["round"] >= last.get(r["seed"], {}).get("round", -1):
            last[r["seed"]] = r
    return [last[s] for s in sorted(last)]


def cell(rows: list[dict], key: str) -> str:
    vals = [r.get(key) for r in rows]
    if not vals or any(v is None for v in vals):
        return "–"
    return f"{np.mean(vals):.3f} ± {np.std(vals):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    args = ap.parse_args()
    cols = [("oca", "acc OCA"), ("aca", "acc ACA"), ("amp_oca", "AMP OCA"),
            ("amp_aca", "AMP ACA"), ("wlp_oca", "WLP OCA"), ("wlp_aca", "WLP ACA")]
    print("| run | R | seeds | rounds | " + " | ".join(c[1] for c in cols) + " |")
    print("|---" * (4 + len(cols)) + "|")
    for d in args.runs:
        rows = final_rows(d)
        if not rows:
            continue
        cfg = json.loads((d / "config.json").read_text())
        print(f"| {d.name} | {cfg['ratio']} | {len(rows)} | {rows[0]['round']} | "
              + " | ".join(cell(rows, k) for k, _ in cols) + " |")


if __name__ == "__main__":
    main()
