"""A real Flower deployment on loopback: a SuperLink and SuperNodes as separate processes, the
mrtf app started with ``flwr run`` (through the launcher), compared with the in-process engine
on the same seed and method. Marked ``deploy`` (``-m 'not deploy'`` leaves it out).

The federation is mnist5k, 2 parties, 15 local steps, 2 rounds of FedAvg (the default; set
``MRTF_DEPLOY_METHODS=fedavg,adaptive,...`` to compare more strategies, about 20-40 s a round
each on a busy 2-core machine): small, but every piece runs (θ_t out, models back, checks, the
strategy's aggregate, scoring). The pilot party (over TLS) runs the default refinery through
``mrtf refine``. Both engines run with one thread (``THREADS``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")
pytest.importorskip("mlxtend")

from flower_deploy import Deployment, write_federation  # noqa: E402

from mrtf.federated.run_config import RunConfig  # noqa: E402
from mrtf.io.hdf5 import write_dataset  # noqa: E402
from mrtf.io.labels import read_labels

pytestmark = pytest.mark.deploy

# One thread in both engines (the floats depend on the thread count; conftest restores the
# suite's 2 after each test): with six processes on two cores, OpenMP's 2-thread barriers spin
# against each other and every step is several times slower.
THREADS = 1
SEED = 0
BASE = dict(dataset="mnist5k", clients=2, split="dirichlet:1.0", ratio=1.0, rounds=2,
            epochs=1, local_steps=15, arch="lenet", target_size=300, seeds=[SEED],
            refine_steps=20)


def flower_config(target, out, **over) -> dict:
    cfg = {"method": "adaptive", "num-rounds": BASE["rounds"], "seed": SEED, "clients": 2,
           "target": str(target), "out": str(out), "epochs": BASE["epochs"],
           "local-steps": BASE["local_steps"], "refine-steps": BASE["refine_steps"],
           "threads": THREADS, "round-timeout": 120.0, "wait-nodes": 60.0}
    cfg.update(over)
    return cfg


@pytest.fixture(scope="module")
def parties(tmp_path_factory):
    root = tmp_path_factory.mktemp("flower-data")
    shards, target = write_federation(RunConfig(**BASE, methods=["adaptive"]), SEED, root)
    # a third SuperNode whose data does not fit the model: 8×8 images
    bad = root / "bad.h5"
    write_dataset(bad, np.zeros((20, 1, 8, 8), np.float32), np.arange(20) % 10)
    return shards, target, bad


def own_model(shard, path):
    """A model party 1 trained before the pilot party asked (a few steps on its shard)."""
    from mrtf.federated.local import LocalConfig, local_train
    from mrtf.io.bundles import BundleMeta, save_bundle
    from mrtf.io.hdf5 import read_dataset
    from mrtf.models import build_model, image_kwargs

    x, y = read_dataset(shard)
    torch.manual_seed(7)
    kwargs = image_kwargs("lenet", 1, 28)
    res = local_train(build_model("lenet", 10, **kwargs), torch.from_numpy(x),
                      torch.from_numpy(y), 10, LocalConfig(steps=5, batch_size=16), seed=7)
    save_bundle(path, res.model, BundleMeta(arch="lenet", num_classes=10, arch_kwargs=kwargs,
                                            party="own", label_counts=res.label_counts,
                                            n_samples=res.n_samples,
                                            train_loss=res.train_loss))
    return res.model.state_dict(), res.label_counts


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(THREADS)


def in_process(tmp_path, method: str) -> list[dict]:
    from mrtf.federated.runner import run

    return run(RunConfig(**BASE, methods=[method]), tmp_path / f"inproc-{method}").records


METHODS = os.environ.get("MRTF_DEPLOY_METHODS", "fedavg").split(",")


@pytest.mark.parametrize("method", METHODS)
def test_deployment_matches_in_process_and_leaves_bad_parties_out(parties, tmp_path, method):
    shards, target, bad = parties
    nodes = [{"partition-id": k, "data": str(p)} for k, p in enumerate(shards)]
    nodes.append({"partition-id": 2, "data": str(bad)})
    with Deployment(tmp_path / "deploy", nodes, threads=THREADS) as d:
        rc, log, seconds = d.run(flower_config(target, tmp_path / "out", method=method))
        assert rc == 0, log[-3000:]
        # the third node claims a party this 2-party run does not have: named, left out
        assert "partition-id 2 is not in 0..1" in log
        if method == METHODS[0]:
            # three parties expected, all three required: the one whose data does not fit
            # is named, and the run stops with one line and exit code 2
            rc2, log2, _ = d.run(flower_config(target, tmp_path / "out2", clients=3,
                                               **{"min-parties": 3}))
            assert rc2 == 2, log2[-3000:]
            assert "party 2" in log2 and "(1, 8, 8)" in log2, log2[-3000:]
            errors = [ln for ln in log2.splitlines() if ln.startswith("mrtf: error:")]
            assert len(errors) == 1 and "fewer than the minimum of 3" in errors[0], errors
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text()
            .splitlines()]
    ref = in_process(tmp_path, method)
    assert [r["round"] for r in rows] == [r["round"] for r in ref] == [1, 2]
    for got, want in zip(rows, ref):
        for col in ("accuracy", "averaged", "ensemble", "refined", "aca", "oca", "local_loss"):
            assert got[col] == want[col], (col, got, want)
    print(f"\nflower run {seconds:.1f} s; per round flower "
          f"{[r['seconds'] for r in rows]} s, in-process {[r['seconds'] for r in ref]} s; "
          f"accuracy {[r['accuracy'] for r in rows]}")


def test_pilot_party_over_tls_writes_what_mrtf_refine_writes(parties, tmp_path):
    shards, target, _ = parties
    nodes = [{"partition-id": k, "data": str(p)} for k, p in enumerate(shards)]
    # party 1 trained its model already: it sends that one instead of training
    trained, counts = own_model(shards[1], tmp_path / "own.safetensors")
    nodes[1]["model"] = str(tmp_path / "own.safetensors")
    out = tmp_path / "pilot"
    with Deployment(tmp_path / "deploy", nodes, threads=THREADS, tls=True) as d:
        rc, log, _ = d.run(flower_config(target, out, mode="pilot", **{"num-rounds": 1}))
        assert rc == 0, log[-3000:]
        assert "Uvicorn running on https://127.0.0.1:" in d.log("superlink")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["parties"] == [0, 1]
    assert sorted(p.name for p in (out / "received").iterdir()) == [
        "party-000.safetensors", "party-001.safetensors"]
    from mrtf.io.bundles import load_bundle

    sent = load_bundle(out / "received" / "party-001.safetensors")
    assert all(torch.equal(sent.state_dict[k], v) for k, v in trained.items())
    assert sent.meta.label_counts == counts
    # the same command by hand on the collected models: the same labels, bit for bit
    again = tmp_path / "again.h5"
    args = summary["command"]
    args[args.index("--labels") + 1] = str(again)
    args[args.index("--model") + 1] = str(tmp_path / "again.safetensors")
    env = {"OMP_NUM_THREADS": str(THREADS)}
    subprocess.run([sys.executable, "-m", "mrtf.cli.main", *args], check=True,
                   env={**os.environ, **env})
    a, b = read_labels(out / "labels.h5"), read_labels(again)
    assert np.array_equal(a.labels, b.labels) and np.array_equal(a.probs, b.probs)
