"""The shared harness of the maintained benchmarks (bench/*.py): the label-quality cells and
their cached received sets, small numeric helpers (public copies, so no benchmark imports a
private name of mrtf) and the provenance every results file records.

Run a benchmark from the repository root (``python bench/NAME.py``): Python puts ``bench/`` on
``sys.path``, so ``from harness import ...`` works; the archived studies in ``bench/studies/``
put ``bench/`` there themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from mrtf.federated import export_received, export_target, run_fedavg
from mrtf.federated.runner import RunConfig, prepare_run
from mrtf.trust.metrics import ece

REPO = Path(__file__).resolve().parents[1]

_ONE_SHOT = dict(dataset="mnist5k", clients=10, ratio=1.0, rounds=1, epochs=20, batch_size=32)
_ROUNDS = dict(dataset="mnist5k", clients=20, split="dirichlet:0.1", ratio=0.2, epochs=2,
               batch_size=32)
#: cell name → the federation whose last round the pilot party receives
CELLS: dict[str, RunConfig] = {
    "oneshot-dir0.1": RunConfig(**_ONE_SHOT, split="dirichlet:0.1"),
    "oneshot-dir0.5": RunConfig(**_ONE_SHOT, split="dirichlet:0.5"),
    "oneshot-label2": RunConfig(**_ONE_SHOT, split="label:2"),
    "rounds-1": RunConfig(**_ROUNDS, rounds=1),
    "rounds-10": RunConfig(**_ROUNDS, rounds=10),
    "rounds-50": RunConfig(**_ROUNDS, rounds=50),
    "digits-to-mnist5k": RunConfig(**{**_ROUNDS, "dataset": "digits"}, target="mnist5k",
                                   image_size=28, rounds=30),
    "mnist5k-to-mnistm5k": RunConfig(**_ROUNDS, target="mnistm5k", rounds=30),
}
#: longer cross-domain federations (issue 10 asks for T=200, seed 0); not in the grid mean
CELLS.update({
    "digits-to-mnist5k-T200": RunConfig(**{**_ROUNDS, "dataset": "digits"}, target="mnist5k",
                                        image_size=28, rounds=200),
    "mnist5k-to-mnistm5k-T200": RunConfig(**_ROUNDS, target="mnistm5k", rounds=200),
})
GRID = [c for c in CELLS if not c.endswith("-T200")]
#: fresh cells (``--fresh``): 9 scenarios that no constant, signal or default was chosen on
#: (first simulated for bench/studies/calibration_fresh.py), so they score the default out of sample
FRESH: dict[str, RunConfig] = {
    "oneshot-label3": RunConfig(**_ONE_SHOT, split="label:3"),
    "oneshot-dir1.0": RunConfig(**_ONE_SHOT, split="dirichlet:1.0"),
    "rounds-3": RunConfig(**_ROUNDS, rounds=3),
    "rounds-25": RunConfig(**_ROUNDS, rounds=25),
    "mnist5k-to-mnistm5k-T10": RunConfig(**_ROUNDS, target="mnistm5k", rounds=10),
    "mnist5k-to-mnistm5k-T100": RunConfig(**_ROUNDS, target="mnistm5k", rounds=100),
    "digits-to-mnist5k-T100": RunConfig(**{**_ROUNDS, "dataset": "digits"},
                                        target="mnist5k", image_size=28, rounds=100),
    # domain pairs the grid does not have
    "mnistm5k-to-mnist5k": RunConfig(**{**_ROUNDS, "dataset": "mnistm5k"},
                                     target="mnist5k", rounds=30),
    "digits-to-mnistm5k": RunConfig(**{**_ROUNDS, "dataset": "digits"},
                                    target="mnistm5k", image_size=28, rounds=30),
}
CELLS.update(FRESH)
SEEDS = (0, 1, 2)


def cached_sets(grids: list[Path], out: Path, part: tuple[int, int] = (0, 1)):
    """The cached received sets under ``grids`` (each ``<set>/received`` and
    ``<set>/target.h5``: :func:`received_set`'s layout) that are this process' share
    (``part`` = (i, n): every n-th from the i-th) and not yet in the JSON results file
    ``out``: (key ``GRID/SET``, the set's folder, its seed, the results so far), the seed
    being the number the set's name ends with. The studies' resumable loop over sets."""
    dirs = [d.parent for g in grids for d in sorted(g.glob("*/received"))]
    for j, d in enumerate(dirs):
        key = f"{d.parent.parent.name}/{d.name}"
        res = json.loads(out.read_text()) if out.is_file() else {}
        if j % part[1] == part[0] and key not in res:
            yield key, d, int(d.name.rsplit("-s", 1)[-1]), res


def study_arguments(doc: str) -> argparse.ArgumentParser:
    """The command line the cached-set studies share (:func:`cached_sets`): ``--grid`` (a
    folder of ``<set>/received``, repeatable), ``--out`` (the JSON results), ``--part i/n``
    (this process' share) and ``--report FILE...``; a study adds its own arguments."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--grid", type=Path, action="append", default=[])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--part", default="0/1", type=_part,
                    help="i/n: this process refines every n-th set")
    ap.add_argument("--report", type=Path, nargs="*", default=None)
    return ap


def _part(text: str) -> tuple[int, int]:
    i, n = map(int, text.split("/"))
    return i, n


def pooled(specs: list[str], keys: list[str]) -> dict[str, list[str]]:
    """The set keys (``GRID/SET``) by group: ``NAME=A,B`` in ``specs`` pools the keys whose
    GRID is A or B under NAME; no specs, one group per GRID."""
    if not specs:
        specs = [f"{g}={g}" for g in dict.fromkeys(k.split("/")[0] for k in keys)]
    pools = {}
    for spec in specs:
        name, prefixes = spec.split("=", 1)
        heads = set(prefixes.split(","))
        pools[name] = [k for k in keys if k.split("/")[0] in heads]
    return pools


def pooled_study_main(doc: str, refine_all: Callable, report: Callable) -> None:
    """The command of a cached-set study that reports by group: :func:`study_arguments` plus
    ``--pool NAME=A,B`` (:func:`pooled`); ``--report`` runs ``report(paths, pools)``, else
    ``refine_all(grids, out, part)``."""
    ap = study_arguments(doc)
    ap.add_argument("--pool", nargs="*", default=[], help="NAME=PREFIX,PREFIX (report)")
    a = ap.parse_args()
    if a.report is not None:
        report(a.report, a.pool)
    else:
        refine_all(a.grid, a.out, a.part)


def received_set(cell: str, seed: int, root: Path) -> tuple[Path, Path]:
    """The cell's exported received directory and target file (simulated once, cached)."""
    where = root / "received" / f"{cell}-s{seed}"
    rx, target = where / "received", where / "target.h5"
    if rx.is_dir() and target.is_file():
        return rx, target
    cfg = CELLS[cell]
    t0 = time.perf_counter()
    fed = prepare_run(cfg, seed)
    sim = run_fedavg(cfg, fed, seed=seed)
    where.mkdir(parents=True, exist_ok=True)
    export_target(sim, target)
    export_received(sim, rx, force=True)
    print(f"  simulated {cell} seed {seed} in {time.perf_counter() - t0:.0f} s", flush=True)
    return rx, target


# ------------------------------------------------------------------ numeric helpers


def softmax(z: np.ndarray) -> np.ndarray:
    """Row softmax over the last axis, float32, computed in float64 (the same arithmetic as
    the refinery's, so the benchmarks' ensembles match its numbers bit for bit)."""
    z = z.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def estimate_scored(res, y: np.ndarray) -> dict:
    """A refine's label-free estimate and its ± as printed, the rule that printed it
    (``reading``: mrtf.trust.midpoint_estimate.READINGS), and the ECE of its per-sample
    calibrated confidence against ``y`` (which only scores; no ECE without a calibration):
    what bench/estimate_coverage.py reads from a cell (issue 35's goals)."""
    out = {"estimate": res.accuracy.refined, "plus_minus": res.accuracy.plus_minus,
           "reading": res.accuracy.reading}
    if res.calibration is not None:
        out["ece"] = ece(res.calibration.confidence, res.probs.argmax(1) == y)
    return out


def logit(p: np.ndarray | float) -> np.ndarray:
    """log(p / (1 - p)) with p clipped to [1e-4, 1 - 1e-4], as mrtf.trust.calibration's."""
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


# ------------------------------------------------------------------ provenance


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance() -> dict:
    """Where a measurement comes from: command, commit (and whether the tree had changes),
    machine, threads, load, versions and the UTC date."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": git("rev-parse", "--short", "HEAD") or "not recorded",
        "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no")),
        "machine": f"{_cpu_model()}, {os.cpu_count()} cores",
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_average": None if load is None else [round(x, 2) for x in load],
        "python": platform.python_version(), "torch": torch.__version__,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def write_json(path: str | os.PathLike, payload: dict) -> Path:
    """``payload`` as JSON with a ``provenance`` entry added."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**payload, "provenance": provenance()}, indent=1) + "\n")
    return path


def flops_per_sample(model, probe) -> int:
    """Multiply-adds × 2 of every Conv2d and Linear on one sample (forward hooks): LeNet at
    28×28 is 2 × (230,400 + 409,600 + 30,720 + 10,080 + 840) = 1,363,280 FLOP."""
    import torch
    from torch import nn

    total = [0]

    def conv(m, _i, o):
        total[0] += 2 * o[0].numel() * (m.in_channels // m.groups) * m.kernel_size[0] * \
            m.kernel_size[1]

    def lin(m, _i, o):
        total[0] += 2 * m.in_features * m.out_features

    hooks = [m.register_forward_hook(conv if isinstance(m, nn.Conv2d) else lin)
             for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.inference_mode():
        model(probe[:1])
    for h in hooks:
        h.remove()
    return total[0]
