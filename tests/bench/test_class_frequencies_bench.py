"""bench/class_frequencies.py: the skewed targets it makes, and its report."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

from mrtf.io.hdf5 import write_dataset

ROOT = Path(__file__).resolve().parents[2]


def _bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("class_frequencies",
                                                  ROOT / "bench" / "class_frequencies.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "class_frequencies", mod)
    spec.loader.exec_module(mod)
    return mod


def test_skewed_targets_keep_each_class_at_its_decayed_share(monkeypatch, tmp_path):
    bench = _bench(monkeypatch)
    y = np.repeat(np.arange(10), 400)
    x = np.random.default_rng(0).random((len(y), 1, 4, 4), dtype=np.float32)
    write_dataset(tmp_path / "t.h5", x, y)
    full, fy = bench.target_of(tmp_path / "t.h5", "full")
    assert len(full) == 4000 and np.array_equal(fy, y)
    skew, sy = bench.target_of(tmp_path / "t.h5", "skew")
    counts = np.bincount(sy, minlength=10)
    assert len(skew) == len(sy) and counts[0] == 400  # 0.7^0: every row of class 0 kept
    assert np.all(np.abs(counts / 400 - 0.7 ** np.arange(10)) < 0.08)
    _, ry = bench.target_of(tmp_path / "t.h5", "reversed")
    back = np.bincount(ry, minlength=10)
    assert back[9] == 400 and back[0] < 30


def test_report_groups_sets_and_compares_the_two_refines(monkeypatch, tmp_path, capsys):
    bench = _bench(monkeypatch)

    def one(acc, est):
        return {"accuracy": acc, "estimate": est, "plus_minus": 0.05, "ece": 0.04}

    rows = {f"std/mnist-usps-k10-dir0.5-default-E2-s{s}|skew":
            {"rows": 800, "even": one(0.80, 0.70), "given": one(0.90, 0.88)} for s in range(2)}
    rows["provenance"] = {"commit": "x"}
    (tmp_path / "r.json").write_text(json.dumps(rows))
    bench.report([tmp_path / "r.json"])
    line = [r for r in capsys.readouterr().out.splitlines() if "mnist-usps k10" in r][0]
    cols = [c.strip() for c in line.strip("|").split("|")]
    assert cols[:5] == ["mnist-usps k10 default", "skew", "2", "0.800 → **0.900**", "2 / 0"]
    assert cols[5] == "-10.0 → -2.0" and cols[6] == "0 → 2" and cols[8] == "5.0 → 5.0"


def test_another_method_is_cached_and_reported_on_its_own(monkeypatch, tmp_path, capsys):
    bench = _bench(monkeypatch)
    assert bench.cache_key("std/a-s0", "skew", "adaptive") == "std/a-s0|skew"
    assert bench.cache_key("std/a-s0", "skew", "nrc") == "std/a-s0|skew|nrc"

    def one(acc):
        return {"accuracy": acc, "estimate": acc, "plus_minus": 0.05, "ece": 0.04}

    name = "std/mnist-usps-k1-shot-E10-s0"
    rows = {f"{name}|skew": {"rows": 600, "even": one(0.70), "given": one(0.80)},
            f"{name}|skew|nrc": {"rows": 600, "even": one(0.60), "given": one(0.90)}}
    (tmp_path / "r.json").write_text(json.dumps(rows))
    bench.report([tmp_path / "r.json"])
    out = capsys.readouterr().out
    default = [r for r in out.splitlines() if "| mnist-usps k1 shot |" in r]
    nrc = [r for r in out.splitlines() if "| mnist-usps k1 shot, nrc |" in r]
    assert len(default) == 1 and "0.700 → **0.800**" in default[0]
    assert len(nrc) == 1 and "0.600 → **0.900**" in nrc[0]
