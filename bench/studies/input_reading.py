"""How the parties read a target under each reading (issue 32; mrtf/refinery/input_reading.py).

For each cached received set (bench/standard_digits.py's ``<out>/received/<cell>``, or a
label-quality grid cell): on the same sample the default scores, the parties' information
I(p̄) = H(mean p̄) − mean H(p̄) under each reading (what the default chooses by, no y), and
the accuracy of the parties' ensemble (AvgProb) there (read here, with y, to see whether the
information tracks it). Enlargements (1.1-1.4) are scored too, though the default never
enlarges. One JSON line per cell in ``--out``; cells already there are skipped.

    OMP_NUM_THREADS=1 MRTF_DATA=../shared/data python bench/studies/input_reading.py \\
        runs/standard_digits/received/mnist-usps-k10-dir0.5-shot-E10-s0 \\
        --out runs/input_reading.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from mrtf.io import H5Dataset, load_received
from mrtf.io.hdf5 import ArraySource
from mrtf.io.reading import Reading
from mrtf.refinery.input_reading import READINGS, choose_reading, sample_rows
from mrtf.refinery.teachers import newest_locals, teacher_logits

#: the default's readings and the enlargements it leaves out
WIDE = READINGS + tuple(Reading(s, fg) for fg in (False, True) for s in (1.1, 1.2, 1.3, 1.4))


def seed_of(cell: Path) -> int:
    return int(cell.name.rsplit("-s", 1)[1])


def run_cell(cell: Path) -> dict:
    """The information and the ensemble's accuracy under every reading of :data:`WIDE`."""
    rs = load_received(cell / "received")
    parties = [m.build("cpu").eval() for m in newest_locals(rs)]
    seed = seed_of(cell)
    with H5Dataset(cell / "target.h5") as target:
        rows = sample_rows(len(target), len(parties), seed)
        x, y = target.take(rows), target.labels()[rows]
        chosen = choose_reading(parties, target, rs.num_classes, seed)
        wide = choose_reading(parties, target, rs.num_classes, seed, readings=WIDE)
    accuracy = {}
    for r in WIDE:
        logits = torch.from_numpy(teacher_logits(parties, ArraySource(r.apply(x))).logits)
        avg_prob = torch.softmax(logits.double(), dim=2).mean(0).numpy()  # the ensemble's
        accuracy[r.spec()] = float((avg_prob.argmax(1) == y).mean())
    return {"cell": cell.name, "chosen": chosen.reading.spec(),
            "chosen_if_enlarging": wide.reading.spec(), "information": dict(wide.information),
            "ensemble_accuracy": accuracy, "sample": len(rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cells", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=Path("runs/input_reading.jsonl"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    done = set()
    if args.out.is_file():
        done = {json.loads(line)["cell"] for line in args.out.read_text().splitlines()}
    for cell in args.cells:
        if cell.name in done:
            continue
        row = run_cell(cell)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        best = max(row["ensemble_accuracy"], key=row["ensemble_accuracy"].get)
        print(f"{cell.name}: chosen {row['chosen']} (enlarging: "
              f"{row['chosen_if_enlarging']}); ensemble best at {best}", flush=True)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
