"""Federated evaluation runs (mrtf.federated.runner): every method in the loop, exact resume,
DP noise, outputs."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from mrtf.errors import InputError
from mrtf.federated.methods import METHODS
from mrtf.federated.runner import RunConfig, RunHooks, run

STRIP = ("seconds", "elapsed")


def tiny(**kw) -> RunConfig:
    base = dict(dataset="digits", clients=6, split="label:2", ratio=0.5, rounds=2,
                local_steps=3, arch="lenet", target_size=200, methods=["fedavg"], seeds=[0],
                refine_steps=5, clr_min_round=1, fusion_iterations=2, fusion_student_steps=1,
                fusion_batch=16)
    base.update(kw)
    return RunConfig(**base)


def strip(records):
    return [{k: v for k, v in r.items() if k not in STRIP} for r in records]


@pytest.fixture(scope="module")
def all_methods(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("runs") / "all"
    return run(tiny(methods=list(METHODS)), out)


def test_every_method_runs_two_rounds(all_methods):
    recs = all_methods.records
    assert [(r["method"], r["round"]) for r in recs] == [(m, t) for m in METHODS
                                                          for t in (1, 2)]
    for r in recs:
        assert 0.0 <= r["accuracy"] <= 1.0 and r["averaged"] is not None
    by = {(r["method"], r["round"]): r for r in recs}
    assert by[("fedavg", 1)]["accuracy"] == by[("fedavg", 1)]["averaged"]
    for m in ("feddf", "st", "st+rd", "mrtf"):
        assert by[(m, 2)]["ensemble"] is not None and by[(m, 2)]["refined"] is not None
    assert by[("fedftg", 2)]["refined"] == by[("fedftg", 2)]["accuracy"]
    assert by[("fedkf", 2)]["oca"] == by[("fedkf", 2)]["accuracy"]
    assert by[("fedkf", 2)]["aca"] is not None
    # same initial model and same clients: round-1 local training equals for non-FedKF methods
    losses = {by[(m, 1)]["local_loss"] for m in METHODS if m != "fedkf"}
    assert len(losses) == 1


def test_outputs_hold_the_jsonl_numbers(all_methods):
    out = all_methods.out
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines == all_methods.records
    summary = (out / "summary.md").read_text()
    for r in lines:
        if r["round"] == 2:
            assert f"| {r['method']} | 0 | 2 | {r['accuracy']:.4f} |" in summary
    assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with h5py.File(out / "metrics.h5") as f:
        np.testing.assert_allclose(f["accuracy"][:], [r["accuracy"] for r in lines])
        assert [m.decode() for m in f["method"][:]] == [r["method"] for r in lines]
    assert json.loads((out / "config.json").read_text())["methods"] == list(METHODS)
    assert (out / "config.toml").is_file()


def test_resume_after_kill_equals_uninterrupted(tmp_path):
    torch.set_num_threads(1)
    cfg = tiny(methods=["fedavg", "mrtf", "fedftg", "fedkf"], seeds=[0, 1],
               local_algorithm="scaffold", dp_sigma=1e-3, dp_clip=10.0)
    full = run(cfg, tmp_path / "a")
    # "killed" after seed 0 fedftg round 1
    part = run(cfg, tmp_path / "b", hooks=RunHooks(halt_after=5))
    assert len(part.records) < len(full.records)
    with pytest.raises(InputError, match="not empty"):
        run(cfg, tmp_path / "b")
    resumed = run(cfg, tmp_path / "b", resume=True)
    assert strip(resumed.records) == strip(full.records)


def test_resume_refuses_a_different_run(tmp_path):
    torch.set_num_threads(1)
    run(tiny(rounds=1), tmp_path / "r")
    with pytest.raises(InputError, match="different run"):
        run(tiny(rounds=2), tmp_path / "r", resume=True)
    assert run(tiny(rounds=2), tmp_path / "r", force=True).records[-1]["round"] == 2
    # a run written before a config key existed resumes when the key has its default value
    cfg_path = tmp_path / "r" / "config.json"
    old = json.loads(cfg_path.read_text())
    del old["local_test"]
    cfg_path.write_text(json.dumps(old))
    assert run(tiny(rounds=2), tmp_path / "r", resume=True).records[-1]["round"] == 2
    with pytest.raises(InputError, match="local_test"):
        run(tiny(rounds=2, local_test=0.2), tmp_path / "r", resume=True)


def test_dp_changes_the_run(tmp_path):
    torch.set_num_threads(1)
    a = run(tiny(rounds=1, local_steps=20), tmp_path / "a")
    b = run(tiny(rounds=1, local_steps=20, dp_sigma=0.5), tmp_path / "b")
    assert a.records[0]["local_loss"] == b.records[0]["local_loss"]  # same local training
    assert a.records[0]["accuracy"] != b.records[0]["accuracy"] or \
        a.records[0]["averaged"] != b.records[0]["averaged"]


def test_local_test_parts_give_amp_fm_wlp(tmp_path):
    from mrtf.federated.fairness import client_accuracies, fairness_metrics
    from mrtf.federated.runner import prepare_run
    from mrtf.models import build_model

    torch.set_num_threads(1)
    cfg = tiny(methods=["fedavg", "fedkf"], local_test=0.2, rounds=1)
    res = run(cfg, tmp_path / "lt")
    fedavg, fedkf = res.records
    assert fedkf["amp"] == fedkf["amp_oca"] and fedkf["amp_aca"] is not None
    assert fedavg["amp"] == fedavg["amp_averaged"] and fedavg.get("amp_oca") is None
    fed = prepare_run(cfg, 0)  # 20 % of each client's samples held out, the rest trains
    assert all(len(t) == int(0.2 * (len(t) + len(p))) for p, t in zip(fed.parts,
                                                                        fed.test_parts))
    assert fedavg["local_loss"] != run(tiny(methods=["fedavg"], rounds=1),
                                       tmp_path / "no").records[0]["local_loss"]
    summary = (tmp_path / "lt" / "summary.md").read_text()
    assert f"| fedkf | aca | {fedkf['amp_aca']:.4f} ± 0.0000 |" in summary
    with h5py.File(tmp_path / "lt" / "metrics.h5") as f:
        np.testing.assert_allclose(f["amp_oca"][:], [np.nan, fedkf["amp_oca"]])
    assert "local test" not in (tmp_path / "no" / "summary.md").read_text()
    # FedAvg's round-1 model (the checkpoint's global state) scored by hand gives the record
    from safetensors.torch import load_file

    tensors = load_file(str(tmp_path / "lt" / "ckpt" / "s0-fedavg.r1.safetensors"))
    model = build_model("lenet", fed.num_classes, **fed.arch_kwargs)
    model.load_state_dict({k[len("global."):]: v for k, v in tensors.items()
                           if k.startswith("global.")})
    accs = client_accuracies(model, fed.x, fed.y, fed.test_parts)
    sizes = np.array([len(p) + len(t) for p, t in zip(fed.parts, fed.test_parts)])
    assert fairness_metrics(accs, sizes) == pytest.approx(
        {k: fedavg[k] for k in ("amp", "fm", "wlp")})


@pytest.mark.parametrize("kw, message", [
    (dict(methods=["fedavg", "nope"]), "unknown method"),
    (dict(dataset="nope"), "unknown dataset"),
    (dict(target="nope"), "unknown target"),
    (dict(clients=4, ratio=0.1), "R·K < 1"),
    (dict(dp_sigma=-0.1), "σ"),
    (dict(local_algorithm="fedprox", mu=0.0), "mu > 0"),
    (dict(local_test=1.0), "local_test"),
])
def test_bad_config_is_refused(tmp_path, kw, message):
    with pytest.raises(InputError, match=message):
        run(tiny(**kw), tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_target_that_does_not_fit_is_refused(tmp_path):
    from mrtf.io.hdf5 import write_dataset

    bad = tmp_path / "two-channels.h5"
    write_dataset(bad, np.zeros((20, 2, 8, 8), np.float32), np.zeros(20, np.int64))
    with pytest.raises(InputError, match="channels"):
        run(tiny(target=str(bad)), tmp_path / "x")
    assert not (tmp_path / "x").exists()
