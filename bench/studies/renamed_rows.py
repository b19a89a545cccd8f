"""How far the renamed-output check (mrtf.trust.weights) is from a false alarm on real
received sets: every party's output rows matched to θ_t's and to the others' median, as is and
with party 0's rows rolled by one class (bench/poison.py's "rolled"). No target data is read.

    python bench/studies/renamed_rows.py runs/label_quality/received/*/received \
        runs/fresh/received/*/received

Prints per set the parties that move ≥ 2 rows ("rows:cost") and, rolled, what party 0 moves;
then the largest clean count and the smallest rolled count.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: harness and the benchmarks

from poison import rolled_state  # noqa: E402

from mrtf.io.bundles import load_received  # noqa: E402
from mrtf.refinery.teachers import newest_global, newest_locals  # noqa: E402
from mrtf.trust.weights import renamed_outputs  # noqa: E402


def scan(directory: str) -> tuple[list[tuple[int, float]], list[tuple[int, float]],
                                  tuple[int, float], tuple[int, float]]:
    """(clean vs θ_t, clean vs median, rolled party 0 vs θ_t, rolled party 0 vs median)."""
    rs = load_received(directory)
    c = rs.num_classes
    states = [m.state_dict for m in newest_locals(rs)]
    theta = newest_global(rs).state_dict
    rolled = [rolled_state(states[0])] + states[1:]
    return (renamed_outputs(states, c, theta)[0], renamed_outputs(states, c)[0],
            renamed_outputs(rolled, c, theta)[0][0], renamed_outputs(rolled, c)[0][0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("received", nargs="+", help="received directories (with θ_t)")
    args = ap.parse_args()
    clean_max, rolled_min = 0, 10**9
    for d in args.received:
        vs_t, vs_m, r_t, r_m = scan(d)

        def fmt(rr):
            return " ".join(f"{m}:{x:.2f}" for m, x in rr if m >= 2) or "-"

        print(f"{os.path.relpath(d)[:52]:52s} θ_t [{fmt(vs_t)}] median [{fmt(vs_m)}] "
              f"rolled: θ_t {r_t[0]}:{r_t[1]:.2f} median {r_m[0]}:{r_m[1]:.2f}")
        clean_max = max([clean_max] + [m for m, _ in vs_t + vs_m])
        rolled_min = min(rolled_min, r_t[0], r_m[0])
    print(f"{len(args.received)} sets: clean parties move at most {clean_max} rows; "
          f"a rolled party at least {rolled_min}")


if __name__ == "__main__":
    main()
