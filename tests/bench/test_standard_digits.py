"""bench/standard_digits.py: jobs, cached cells (a rerun computes nothing), the report."""

import importlib.util
import json
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from mrtf.data import ArrayDataset

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # it imports bench/harness.py
    spec = importlib.util.spec_from_file_location("standard_digits",
                                                  ROOT / "bench" / "standard_digits.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "standard_digits", mod)  # its dataclasses look it up
    spec.loader.exec_module(mod)
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = (d.images / 16.0).astype(np.float32)[:, None], d.target.astype(np.int64)

    def tiny(name, split, size, channels, frame="resize"):  # real digits stand in
        rows = slice(0, 400) if split == "train" else slice(1000, 1200)
        mod.loads.append((name, split, frame))
        return ArrayDataset(f"{name}:{split}", x[rows], y[rows])

    mod.loads = []
    monkeypatch.setattr(mod, "_dataset", tiny)
    monkeypatch.setitem(mod.PAIRS, "tiny", mod.Pair("usps", "mnist", 8, 1))
    monkeypatch.setitem(mod.EPOCHS, ("default", "usps"), (1, 1))
    calls = []
    real = mod.simulate
    monkeypatch.setattr(mod, "simulate", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    mod.calls = calls
    return mod


def test_cells_are_cached_and_reported(bench, tmp_path):
    job = bench.make_job("tiny", "k1", "default", 0, bench.EPOCHS)
    assert job.name == "tiny-k1-default-E1-s0"
    first = [bench.run_one(job, m, tmp_path) for m in ("fedavg", "ensemble")]
    assert len(bench.calls) == 1  # the parties are simulated once for every method
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in first)
    cached = [bench.run_one(job, m, tmp_path) for m in ("fedavg", "ensemble")]
    assert cached == first and len(bench.calls) == 1  # nothing recomputed
    cell = tmp_path / "cells" / "tiny-k1-default-E1-s0-ensemble.json"
    assert json.loads(cell.read_text())["accuracy"] == first[1]["accuracy"]
    done = json.loads((tmp_path / "received" / job.name / "done.json").read_text())
    assert done["config"]["clients"] == 1 and done["config"]["target"] == "mnist:test"
    md = bench.report(tmp_path, ["fedavg", "ensemble"])
    assert "tiny / k1 / default (E 1)" in md and f"{first[0]['accuracy']:.3f}" in md
    assert (tmp_path / "standard_digits.json").is_file()


def test_jobs_and_shards(bench):
    args = Namespace(pairs="mnist-usps,usps-mnist", settings="k1,k10-dir0.5-r10",
                     recipes="shot", seeds="0,1", epochs="shot:mnist=10")
    jobs = bench.jobs_of(args)
    assert len(jobs) == 8
    by = {(j.pair, j.setting, j.seed): j.epochs for j in jobs}
    assert by[("mnist-usps", "k1", 0)] == 10 and by[("usps-mnist", "k1", 1)] == 30
    assert by[("mnist-usps", "k10-dir0.5-r10", 0)] == 3  # per round of 10
    k1 = {j.pair: j for j in jobs if j.setting == "k1" and j.seed == 0}
    cfg = bench.run_config(k1["usps-mnist"])  # SHOT augments its USPS source only
    assert cfg.local_augment and cfg.arch == "lenet_shot" and cfg.label_smoothing == 0.1
    assert not bench.run_config(k1["mnist-usps"]).local_augment
    assert len({tuple(j.name for j in jobs[i::2]) for i in (0, 1)}) == 2


def test_framed_usps_pairs_are_their_own_cells(bench):
    """USPS framed as MNIST (data/standard.py, frame="mnist") only where named; cells apart."""
    assert "mnist-usps-framed" not in bench.DEFAULT_PAIRS
    args = Namespace(pairs="mnist-usps,mnist-usps-framed,usps-framed-mnist", settings="k1",
                     recipes="shot", seeds="0", epochs=None)
    jobs = {j.pair: j for j in bench.jobs_of(args)}
    assert jobs["mnist-usps-framed"].name == "mnist-usps-framed-k1-shot-E30-s0"
    assert len({j.name for j in jobs.values()}) == 3
    framed_target = bench.run_config(jobs["mnist-usps-framed"])
    assert (framed_target.dataset, framed_target.target) == ("mnist:train", "usps:test:framed")
    framed_source = bench.run_config(jobs["usps-framed-mnist"])
    assert framed_source.dataset == "usps:train:framed" and framed_source.local_augment
    framed_source.validate()
    assert bench.run_config(jobs["mnist-usps"]).target == "usps:test"
    bench.federation(framed_source, jobs["usps-framed-mnist"])
    assert bench.loads == [("usps", "train", "mnist"), ("mnist", "test", "resize")]
