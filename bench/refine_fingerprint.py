"""Fingerprints of ``refine`` over many settings, in memory and spilled: a hash of every
output (labels' probabilities, targets, θ_{t+1}'s probabilities, the model's own, the refined
weights, ``RefineResult.to_dict()`` (the run's account, once ``info``), the calibration). Run
it on two trees with the same thread count and compare: a refactoring of the refinery must
leave every hash as it was (issue 34).

    OMP_NUM_THREADS=1 python bench/refine_fingerprint.py before.json   # on the old tree
    OMP_NUM_THREADS=1 python bench/refine_fingerprint.py after.json    # on the new one
    python bench/refine_fingerprint.py --compare before.json after.json

31 settings x {stream off, on} on scikit-learn digits (a 2-round digits federation, 3
class-specialist parties, heterogeneous parties with a student, dead parties, a poisoned
party, a target new to the parties), 10 distillation steps each: about a minute on one core.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from mrtf.data import load_builtin
from mrtf.federated import (
    LocalConfig,
    RunConfig,
    export_received,
    export_target,
    local_train,
    run_fedavg,
)
from mrtf.io.bundles import BundleMeta, ReceivedModel, ReceivedSet, load_received
from mrtf.io.hdf5 import ArraySource
from mrtf.models import build_model
from mrtf.refinery import RefineConfig, refine

KW = {"in_channels": 1, "image_size": 8}


def h(a):
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    return hashlib.sha256(a.tobytes() + str(a.dtype).encode() + str(a.shape).encode()).hexdigest()[
        :16
    ]


def fed(root: Path):
    if not (root / "received").exists():
        cfg = RunConfig(
            dataset="digits",
            clients=8,
            split="dirichlet:0.5",
            ratio=0.5,
            rounds=2,
            arch="lenet",
            target_size=300,
            seeds=[0],
            epochs=2,
            batch_size=32,
        )
        r = run_fedavg(cfg)
        export_received(r, root / "received")
        export_target(r, root / "target.h5")
    return load_received(root / "received")


def _meta(role, res=None, arch="lenet"):
    return BundleMeta(
        arch=arch,
        num_classes=10,
        arch_kwargs=dict(KW),
        role=role,
        n_samples=None if res is None else res.n_samples,
        train_loss=None if res is None else res.train_loss,
    )


def demo():
    ds = load_builtin("digits")
    perm = np.random.default_rng(0).permutation(len(ds.y))
    train, target = perm[:1200], perm[1200:]
    x, y = torch.from_numpy(ds.x), torch.from_numpy(ds.y)
    torch.manual_seed(0)
    init = build_model("lenet", 10, **KW)
    models = []
    for k, cls in enumerate(((0, 1), (2, 3), (4, 5))):
        idx = train[np.isin(ds.y[train], cls)]
        # batch 64: the fingerprints' parties (LocalConfig's default batch is 16 now)
        local = LocalConfig(steps=100, lr=0.01, batch_size=64)
        res = local_train(init, x[idx], y[idx], 10, local, seed=k)
        models.append(
            ReceivedModel(
                Path(f"client-{k}.safetensors"), _meta("local", res), res.model.state_dict()
            )
        )
    start = ReceivedModel(Path("global.safetensors"), _meta("global"), init.state_dict())
    return ReceivedSet(models + [start], []), ds.x[target]


def poisoned(received):
    models = list(received.models)
    first = next(i for i, m in enumerate(models) if m.meta.role == "local")
    m = models[first]
    state = {k: v * 100 if v.is_floating_point() else v for k, v in m.state_dict.items()}
    models[first] = ReceivedModel(m.path, m.meta, state)
    return ReceivedSet(models, [])


def claiming(received, loss):
    return ReceivedSet(
        [
            ReceivedModel(
                m.path,
                replace(m.meta, train_loss=loss) if m.meta.role == "local" else m.meta,
                m.state_dict,
            )
            for m in received.models
        ],
        [],
    )


def run(name, received, x, student=None, **kw):
    out = {}
    for stream in ("off", "on"):
        base = dict(
            steps=10,
            batch_size=32,
            progress=False,
            inference_batch=256,
            stream=stream,
            scratch_dir=SCRATCH,
        )
        base.update(kw)
        st = None if student is None else copy.deepcopy(student)
        r = refine(received, ArraySource(x), RefineConfig(**base), student=st)
        info = r.to_dict()
        info.pop("streaming", None)
        info["config"] = {**info["config"], "scratch_dir": None}  # a temporary path
        sd = b"".join(v.detach().cpu().numpy().tobytes() for v in r.model.state_dict().values())
        out[stream] = {
            "probs": h(r.probs),
            "target": h(r.target_probs),
            "avg": h(r.averaged_probs),
            "model_probs": h(r.model_probs),
            "model": hashlib.sha256(sd).hexdigest()[:16],
            "info": hashlib.sha256(
                json.dumps(info, sort_keys=True, default=str).encode()
            ).hexdigest()[:16],
            "info_keys": sorted(r.to_dict()),
            "timings": sorted(r.timings),
            "cal": hashlib.sha256(
                json.dumps(
                    r.calibration.attrs() if r.calibration is not None else None,
                    sort_keys=True,
                    default=str,
                ).encode()
            ).hexdigest()[:16],
            "argmax": h(r.probs.argmax(1)),
        }
        print(name, stream, out[stream]["probs"], out[stream]["info"], flush=True)
    return out


def fingerprints(work: Path) -> dict:
    res = {}
    F = fed(work / "fed")
    xd = load_builtin("digits").x
    D, xs = demo()
    for m in ("adaptive", "fedavg", "feddf", "st", "st+rd", "mrtf"):
        res[f"fed-{m}"] = run(f"fed-{m}", F, xd, method=m, clr_min_round=0)
    res["fed-mrtf-skip"] = run("fed-mrtf-skip", F, xd, method="mrtf")
    for m in ("st+rd", "mrtf", "adaptive"):
        res[f"fed-{m}-ref"] = run(
            f"fed-{m}-ref", F, xd, method=m, variant="reference", clr_min_round=0
        )
    res["fed-ad-uniform"] = run("fed-ad-uniform", F, xd, class_prior="uniform")
    res["fed-ad-learned"] = run("fed-ad-learned", F, xd, class_prior="learned")
    res["fed-ad-notrust"] = run("fed-ad-notrust", F, xd, trust=False)
    res["fed-ad-median"] = run("fed-ad-median", F, xd, aggregate="median")
    res["fed-ad-noaug-vote0"] = run("fed-ad-noaug", F, xd, augment=False, neighbour_vote=0)
    res["fed-mrtf-trust"] = run("fed-mrtf-trust", F, xd, method="mrtf", trust=True, clr_min_round=0)
    P = poisoned(F)
    res["poison-ad"] = run("poison-ad", P, xd)
    res["poison-st"] = run("poison-st", P, xd, method="st", trust=True)
    res["novel-ad"] = run("novel-ad", claiming(F, 0.0), xd, trust=False, batch_size=600)
    res["novel-ad-trust"] = run("novel-ad-trust", claiming(F, 0.0), xd)
    for m in ("adaptive", "feddf", "st+rd", "mrtf"):
        res[f"demo-{m}"] = run(f"demo-{m}", D, xs, method=m, clr_min_round=0)
    torch.manual_seed(1)
    other = build_model("mlp", 10, **KW)
    mixed = ReceivedSet(
        D.by_role("local")[:2]
        + [ReceivedModel(Path("mlp.safetensors"), _meta("local", arch="mlp"), other.state_dict())],
        [],
    )
    torch.manual_seed(2)
    student = build_model("lenet", 10, **KW)
    for m in ("adaptive", "mrtf", "st+rd"):
        res[f"hetero-{m}"] = run(
            f"hetero-{m}", mixed, xs, student=student, method=m, clr_min_round=0
        )
    res["demo-student-ad"] = run("demo-student-ad", D, xs, student=student)
    dead = ReceivedSet(
        [
            ReceivedModel(m.path, m.meta, {k: torch.zeros_like(v) for k, v in m.state_dict.items()})
            for m in D.by_role("local")
        ]
        + D.by_role("global"),
        [],
    )
    res["dead-ad"] = run("dead-ad", dead, xs)
    nog = ReceivedSet(
        [ReceivedModel(m.path, _meta("local"), m.state_dict) for m in D.by_role("local")], []
    )
    res["noglobal-strd"] = run("noglobal-strd", nog, xs, method="st+rd")
    res["noglobal-ad"] = run("noglobal-ad", nog, xs)
    return res


def compare(a: dict, b: dict) -> int:
    diffs = 0
    for name in a:
        for mode in a[name]:
            for key, value in a[name][mode].items():
                other = b.get(name, {}).get(mode, {}).get(key)
                if other != value:
                    diffs += 1
                    print(f"DIFF {name} stream={mode} {key}: {value} -> {other}")
    total = sum(len(a[n][m]) for n in a for m in a[n])
    print(f"{diffs} of {total} fingerprints differ")
    return diffs


def main() -> None:
    global SCRATCH
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", type=Path, help="write the fingerprints here (.json)")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(p.read_text()) for p in args.compare)
        raise SystemExit(1 if compare(a, b) else 0)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        SCRATCH = str(Path(tmp) / "scratch")
        args.out.write_text(json.dumps(fingerprints(Path(tmp)), indent=1, sort_keys=True))


SCRATCH = tempfile.gettempdir()

if __name__ == "__main__":
    main()
