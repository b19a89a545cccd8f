"""Why SHOT stays below its published MNIST → USPS figure here: one protocol change at a time.

Reads the K = 1 MNIST source model that ``bench/standard_digits.py`` simulated (SHOT's source
recipe, cached under ``--bench-out``) and runs SHOT's target recipe (``ShotSettings.paper()``)
on USPS prepared in different ways, always scoring on the USPS test set (2,007):

- ``test``: the benchmark's protocol (adapt on the test set, USPS 16×16 resized to 28×28);
- ``test-long``: the same with 110 epochs (≈ the 3,510 steps SHOT takes on its 7,438 images);
- ``train``: SHOT's protocol (adapt on the USPS train split, 7,291, score on test);
- ``framed``: USPS resized to 20×20 and padded by 4 px, framed as MNIST's digits are
  (MNIST: a 20×20 box centred in 28×28), adapted on the test set;
- ``framed-train``: both.

Also prints the source model's accuracy on each USPS variant (no adaptation). ::

    OMP_NUM_THREADS=1 MRTF_DATA=../shared/data python bench/shot_protocol.py --seed 0
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import numpy as np

from mrtf.data import load_standard
from mrtf.io import load_received
from mrtf.io.hdf5 import ArraySource
from mrtf.refinery import ShotSettings, predict_probs, shot_adapt

VARIANTS = ("test", "test-long", "train", "framed", "framed-train")


def usps(split: str, framed: bool) -> tuple[np.ndarray, np.ndarray]:
    """USPS at 28×28: resized over the whole frame, or to 20×20 inside a 4 px border."""
    d = load_standard("usps", split, size=28, frame="mnist" if framed else "resize")
    return d.x, d.y


def accuracy(model, x: np.ndarray, y: np.ndarray) -> float:
    return float((predict_probs(model, ArraySource(x)).argmax(1) == y).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench-out", default="runs/standard_digits")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", default="shot:mnist=10", help="as the benchmark was run")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    mnist_epochs = int(args.epochs.rpartition("=")[2])
    rx = Path(args.bench_out) / "received" / f"mnist-usps-k1-shot-E{mnist_epochs}-s{args.seed}"
    source = load_received(rx / "received").models[0].build("cpu")
    for framed in (False, True):
        x, y = usps("test", framed)
        print(f"seed {args.seed} source only, USPS {'framed' if framed else 'resized'}: "
              f"{accuracy(source, x, y):.4f}", flush=True)
    for variant in args.variants.split(","):
        framed = variant.startswith("framed")
        x_te, y_te = usps("test", framed)
        x_ad = usps("train", framed)[0] if variant.endswith("train") else x_te
        epochs = 110 if variant == "test-long" else 30
        t0 = time.perf_counter()
        model = shot_adapt(copy.deepcopy(source), ArraySource(x_ad),
                           ShotSettings.paper(epochs=epochs), seed=args.seed)
        print(f"seed {args.seed} SHOT {variant:13s} {accuracy(model, x_te, y_te):.4f} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
