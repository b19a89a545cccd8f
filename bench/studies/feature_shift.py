"""The novelty signals side by side on cached received sets (issue 32's vote-or-adapt miss).

    OMP_NUM_THREADS=1 MRTF_DATA=/work/shared/data python bench/studies/feature_shift.py \
        [--bench /work/bench32] [--lq /work/lq] [--extra DIR ...]

For every received set of the standard digits cache (``BENCH/received/<job>``) and of the
in-house grid (``LQ/received/<cell>``): the loss gap novelty.py reads today (the parties'
median target entropy - their median claimed training loss), and, for models with BatchNorm,
the feature shift feature_shift.py reads (the parties' running statistics against the target's
features: median over the parties of the mean over layers and channels), on the job's target
and, for the standard pairs, on the source's own test set (in-domain: it should be small).
Beside them, from the cells (``BENCH/cells``), the branch the default took and the accuracies
of the default and SHOT, so that which branch won can be read. No refine is run; y is read only
through the cells' recorded accuracies. ``--extra DIR``: a received set ``DIR/received`` with
``DIR/target.h5`` (e.g. a KEEP folder of bench/independent_starts.py; pass its architecture
with ``--trust-arch``).

Columns (medians over the parties; 2,048 evenly spaced rows): gap, the loss gap; skl / z / lvr,
the symmetric KL, standardised mean shift and log variance ratio read with dropout off (eval
mode); d_*, the same read with dropout on as the parties trained (d_skl is what
feature_shift.py reads); flip / tv, AdaBN's share of changed labels and total variation when
the target's statistics replace the running ones; agree, the parties' mean pairwise label
agreement; marg, the entropy of a party's mean prediction. Conclusions:
docs/benchmarks/novelty.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from mrtf.data import load_standard
from mrtf.io import H5Dataset, load_received
from mrtf.refinery.feature_shift import MAX_SAMPLES, batchnorms, layer_shifts
from mrtf.refinery.novelty import mean_entropies
from mrtf.trust.neighbours import reference_rows

PAIRS = {"mnist-usps": ("mnist", 28, 1), "usps-mnist": ("usps", 28, 1),
         "mnist-mnistm": ("mnist", 32, 3), "mnist-usps-framed": ("mnist", 28, 1)}


def blocks_of(x: np.ndarray, size: int = 512) -> list[np.ndarray]:
    return [x[s:s + size] for s in range(0, len(x), size)]


def target_statistics_model(model: nn.Module, blocks: Sequence[np.ndarray],
                            dev: torch.device | str = "cpu", seed: int = 0) -> nn.Module:
    """A copy of ``model`` whose BatchNorm running statistics are the target's (AdaBN, Li et
    al. 2016): one pass in training mode with cumulative averages, dropout on as the parties
    trained (so both statistics carry its noise)."""
    m = copy.deepcopy(model)
    for bn in batchnorms(m):
        bn.reset_running_stats()
        bn.momentum = None
    m.train()
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for x in blocks:
            m(torch.as_tensor(x, device=dev))
    return m.eval()


def measures(model, x) -> tuple[dict[str, float] | None, np.ndarray]:
    """Mean over BN layers of each channel statistic's mean (and median) over channels (None
    without BN), and the model's logits on x, from one pass."""
    outs: list = []
    layers = layer_shifts(model, blocks_of(x), outputs=outs)
    logits = np.concatenate(outs)
    if not layers:
        return None, logits
    drop = layer_shifts(model, blocks_of(x), dropout_on=True)
    with torch.no_grad():
        adapted = target_statistics_model(model, blocks_of(x))
        q = torch.cat([adapted(torch.as_tensor(b)) for b in blocks_of(x)]).softmax(1).numpy()
    z = logits - logits.max(1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    return {"skl": float(np.mean([ls.symmetric_kl().mean() for ls in layers])),
            "z": float(np.mean([ls.mean_shift().mean() for ls in layers])),
            "lvr": float(np.mean([ls.log_var_ratio().mean() for ls in layers])),
            "d_skl": float(np.mean([ls.symmetric_kl().mean() for ls in drop])),
            "d_skl_med": float(np.mean([np.median(ls.symmetric_kl()) for ls in drop])),
            "d_z": float(np.mean([ls.mean_shift().mean() for ls in drop])),
            "d_lvr": float(np.mean([ls.log_var_ratio().mean() for ls in drop])),
            "flip": float((p.argmax(1) != q.argmax(1)).mean()),
            "tv": float(0.5 * np.abs(p - q).sum(1).mean())}, logits


def behaviour(logits: np.ndarray) -> dict[str, float]:
    """The parties' agreement (mean pairwise argmax agreement) and the median entropy of each
    party's mean prediction over the target (nats: log 10 = 2.30 when every class is
    predicted equally often)."""
    labels = logits.argmax(2)
    k = len(labels)
    pairs = [(labels[i] == labels[j]).mean() for i in range(k) for j in range(i + 1, k)]
    z = logits - logits.max(2, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(2, keepdims=True)
    marg = p.mean(1)
    ent = -(marg * np.log(marg + 1e-12)).sum(1)
    return {"agree": float(np.mean(pairs)) if pairs else 1.0, "marg": float(np.median(ent))}


def study(rx: Path, x: np.ndarray, trusted: list[str]) -> dict:
    rs = load_received(rx, trusted_archs=trusted)
    local = [m for m in rs.models if (m.meta.role or "local") == "local"]
    got = [measures(m.build(), x) for m in local]
    party = [g[0] for g in got]
    logits = np.stack([g[1] for g in got])
    row = {"k": len(local), "bn": all(p is not None for p in party), **behaviour(logits)}
    if row["bn"]:
        for key in party[0]:
            row[key] = float(np.median([p[key] for p in party]))
    h = float(np.median(mean_entropies(logits, len(local))))
    rep = [m.meta.train_loss for m in local if m.meta.train_loss is not None]
    row["gap"] = None if not rep else h - float(np.median(rep))
    return row


def cell(bench: Path, job: str, method: str) -> dict:
    p = bench / "cells" / f"{job}-{method}.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def fmt(v, spec=".3f") -> str:
    return "-" if v is None else (format(v, spec) if isinstance(v, float) else str(v))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", type=Path, default=Path("/work/bench32"))
    ap.add_argument("--lq", type=Path, default=Path("/work/lq"))
    ap.add_argument("--extra", type=Path, nargs="*", default=[])
    ap.add_argument("--trust-arch", nargs="*", default=[])
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    head = ("| set | target | K | gap | skl | z | lvr | d_skl | d_skl_med | d_z | d_lvr | "
            "flip | tv | agree | marg | branch | default | shot |")
    print(head + "\n|" + "---|" * (head.count("|") - 1))
    sets = []
    bench_sets = args.bench / "received"
    for d in sorted(bench_sets.iterdir()) if bench_sets.is_dir() else []:
        pair = next((p for p in sorted(PAIRS, key=len, reverse=True)
                     if d.name.startswith(p + "-")), None)
        if pair and re.search(args.only, d.name):
            sets.append(("bench", d, pair))
    for d in sorted((args.lq / "received").iterdir()) if args.lq.is_dir() else []:
        if re.search(args.only, d.name):
            sets.append(("lq", d, None))
    sets += [("extra", d, None) for d in args.extra]
    for _kind, d, pair in sets:
        rows = []
        with H5Dataset(d / "target.h5") as t:
            x = t.take(reference_rows(len(t), MAX_SAMPLES))
        rows.append(("target", x))
        if pair:
            src, size, ch = PAIRS[pair]
            frame = "resize"
            ds = load_standard(src, "test", size=size, channels=ch, frame=frame)
            xs = ds.x.astype(np.float32) / 255.0 if ds.x.dtype == np.uint8 else ds.x
            rows.append((f"{src} test (in-domain)", xs[reference_rows(len(xs), MAX_SAMPLES)]))
        ad, sh = cell(args.bench, d.name, "adaptive"), cell(args.bench, d.name, "shot")
        nov = ad.get("novelty", "")
        branch = "adapt" if "adapted to it" in nov else ("vote" if nov else "-")
        for name, xx in rows:
            r = study(d / "received", xx, args.trust_arch)
            print(f"| {d.name} | {name} | {r['k']} | {fmt(r['gap'])} | {fmt(r.get('skl'))} | "
                  f"{fmt(r.get('z'))} | {fmt(r.get('lvr'))} | {fmt(r.get('d_skl'))} | "
                  f"{fmt(r.get('d_skl_med'))} | {fmt(r.get('d_z'))} | {fmt(r.get('d_lvr'))} | "
                  f"{fmt(r.get('flip'))} | {fmt(r.get('tv'))} | {fmt(r['agree'])} | "
                  f"{fmt(r['marg'])} | "
                  f"{branch if name == 'target' else ''} | "
                  f"{fmt(ad.get('accuracy')) if name == 'target' else ''} | "
                  f"{fmt(sh.get('accuracy')) if name == 'target' else ''} |", flush=True)


if __name__ == "__main__":
    main()
