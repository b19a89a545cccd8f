"""Parties from independent starts (issue 33 item 3): the default's labels against the
ensemble, the best party and the parameter average, on one received set trained here.

    OMP_NUM_THREADS=1 python bench/independent_starts.py mnist5k 5 0.5 5 0 [shared|indep] [ARCH] \
        [KEEP]

(dataset, parties, Dirichlet α, local epochs, seed; ARCH a built-in architecture, default
``lenet``; ``lenet_shot`` is a CNN with BatchNorm; or a user's ``module:factory``, e.g.
``bench.models.mynet:make``, run from the repository root). K parties train on their Dirichlet
shards (``mrtf.federated.local_train``, batch 32), each from its own random start (seed
1000·SEED + 100 + k), or all from one with ``shared``; then ``refine`` with the default config.
A user's model goes the way a user's file does: ``torch.save(model.state_dict())`` and a
``.json`` sidecar per party, read back by ``load_received(..., trusted_archs=[ARCH])`` (what
``mrtf refine --trust-arch ARCH`` does). KEEP: a folder to keep them in (``KEEP/received``) with
the target (``KEEP/target.h5``), for ``mrtf refine KEEP/received --trust-arch ARCH --data
KEEP/target.h5 ...``.
Numbers: docs/benchmarks/takeover.md.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from mrtf.averaging import average_received
from mrtf.federated import export_target, local_train
from mrtf.federated.runner import RunConfig, prepare_run
from mrtf.io.bundles import BundleMeta, ReceivedModel, ReceivedSet, load_received
from mrtf.io.hdf5 import ArraySource
from mrtf.models import build_model
from mrtf.refinery import RefineConfig, accuracy_of, refine


def parties(ds: str, k: int, alpha: str, epochs: int, seed: int, shared: bool,
            arch: str = "lenet", keep: Path | None = None):
    """The received set (K locals, round 1) and the federation (its target)."""
    cfg = RunConfig(dataset=ds, clients=k, split=f"dirichlet:{alpha}", ratio=1.0, rounds=1,
                    arch=arch, seeds=[seed], epochs=epochs, batch_size=32,
                    **({"target_size": 300} if ds == "digits" else {}))
    fed = prepare_run(cfg, seed)
    models = []
    for i in range(k):
        torch.manual_seed(seed if shared else 1000 * seed + 100 + i)
        start = build_model(arch, fed.num_classes, **fed.arch_kwargs)
        idx = torch.from_numpy(fed.parts[i])
        res = local_train(start, fed.x[idx], fed.y[idx], fed.num_classes, cfg.local_config(),
                          seed=seed * 7919 + i)
        meta = BundleMeta(arch=arch, num_classes=fed.num_classes,
                          arch_kwargs=fed.arch_kwargs, party=f"p{i}", n_samples=len(idx),
                          train_loss=res.train_loss, round=0)
        models.append(ReceivedModel(Path(f"p{i}.safetensors"), meta, res.model.state_dict()))
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        export_target(fed, keep / "target.h5")
    if ":" in arch:
        return as_user_files(models, arch, keep), fed
    return ReceivedSet(models, []), fed


def as_user_files(models: list[ReceivedModel], arch: str, keep: Path | None) -> ReceivedSet:
    """The parties' models as a user's parties send them (a plain state_dict ``.pt`` and a
    sidecar each), loaded back through the received-file path with ``arch`` trusted."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) if keep is None else keep / "received"
        folder.mkdir(exist_ok=True)
        for m in models:
            torch.save(m.state_dict, folder / f"{m.meta.party}.pt")
            sidecar = {"mrtf.arch": arch, "mrtf.num_classes": m.meta.num_classes,
                       "mrtf.party": m.meta.party, "mrtf.n_samples": m.meta.n_samples,
                       "mrtf.train_loss": m.meta.train_loss}
            (folder / f"{m.meta.party}.json").write_text(json.dumps(sidecar))
        return load_received(folder, trusted_archs=[arch])


def main() -> None:
    ds, k, alpha, epochs, seed = sys.argv[1], int(sys.argv[2]), sys.argv[3], \
        int(sys.argv[4]), int(sys.argv[5])
    shared = len(sys.argv) > 6 and sys.argv[6] == "shared"
    arch = sys.argv[7] if len(sys.argv) > 7 else "lenet"
    keep = Path(sys.argv[8]) if len(sys.argv) > 8 else None
    torch.set_num_threads(1)
    t0 = time.time()
    rs, fed = parties(ds, k, alpha, epochs, seed, shared, arch, keep)
    x, y = fed.target_x, fed.target_y.numpy()
    with torch.inference_mode():
        probs = torch.stack([m.build()(x).softmax(1) for m in rs.models])
        avg, _ = average_received(rs.models, by_samples=False)
        average = float((avg(x).argmax(1).numpy() == y).mean())
    ensemble = float((probs.mean(0).argmax(1).numpy() == y).mean())
    best = max(float((p.argmax(1).numpy() == y).mean()) for p in probs)
    trained = time.time() - t0
    others = {m: accuracy_of(refine(rs, ArraySource(x.numpy()), RefineConfig(
        method=m, seed=seed, progress=False)).probs, y) for m in ("feddf", "st")}
    t1 = time.time()
    res = refine(rs, ArraySource(x.numpy()), RefineConfig(seed=seed, progress=False))
    flagged = [v for v in (res.parties.verdicts if res.parties else []) if "trusted" not in v]
    print(f"{ds} {arch} K={k} dir{alpha} E={epochs} seed={seed} "
          f"{'shared' if shared else 'independent'}: default labels "
          f"{accuracy_of(res.probs, y):.3f} | ensemble {ensemble:.3f} | "
          f"feddf {others['feddf']:.3f} | st {others['st']:.3f} | best party {best:.3f} | "
          f"average {average:.3f} | flagged {len(flagged)} | train {trained:.0f}s refine "
          f"{time.time() - t1:.0f}s")
    print("  note0:", res.notes[0] if res.notes else None)


if __name__ == "__main__":
    main()
