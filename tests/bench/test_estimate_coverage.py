"""bench/estimate_coverage.py and the scorer both benchmarks record its fields with
(harness.estimate_scored): coverage, median ±, median ECE and the mean signed error."""

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mrtf.trust.metrics import ece

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, mod)  # its dataclasses look it up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture()
def coverage(monkeypatch):
    return _load("estimate_coverage", monkeypatch)


def _cell(cells: Path, name: str, row: dict) -> None:
    cells.mkdir(parents=True, exist_ok=True)
    (cells / f"{name}-adaptive.json").write_text(json.dumps(row))


def test_readings_and_summary(coverage, tmp_path):
    cells = tmp_path / "cells"
    _cell(cells, "a-s0", {"accuracy": 0.80, "estimate": 0.70, "plus_minus": 0.05, "ece": 0.09})
    _cell(cells, "b-s0", {"accuracy": 0.60, "estimate": 0.62, "plus_minus": 0.03, "ece": 0.02})
    # an older label-quality cell: the estimate in its info, no ECE
    _cell(cells, "c-s0", {"accuracy": 0.50,
                          "info": {"estimated_accuracy": {"refined": 0.55, "plus_minus": 0.10}}})
    _cell(cells, "d-s0", {"accuracy": 0.40})  # no estimate: not read
    rows = coverage.readings(cells)
    assert [r.name for r in rows] == ["a-s0-adaptive", "b-s0-adaptive", "c-s0-adaptive"]
    assert [r.inside for r in rows] == [False, True, True]
    assert rows[0].error == pytest.approx(-0.10) and rows[2].ece is None
    line = coverage.summary_row("bench", rows)
    cols = [c.strip() for c in line.strip("|").split("|")]
    assert cols[:4] == ["bench", "3", "2 / 3 (67 %)", "5.0"]
    assert cols[4] == "0.055 (2 sets)"  # the median of the recorded ECEs only
    assert cols[5] == "-1.0"  # (-10 + 2 + 5) / 3 points: read low on average
    assert cols[6] == "-10.0 (a-s0-adaptive)"
    assert coverage.summary_row("none", []).count("–") == 5  # one per column after "sets"


def test_estimate_scored(monkeypatch):
    harness = _load("harness", monkeypatch)
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.4, 0.6]], np.float32)
    y = np.array([0, 1, 1, 1])
    conf = np.array([0.9, 0.8, 0.7, 0.6])
    res = SimpleNamespace(probs=probs, accuracy=SimpleNamespace(refined=0.7, plus_minus=0.1,
                                                                reading="middle band"),
                          calibration=SimpleNamespace(confidence=conf))
    out = harness.estimate_scored(res, y)
    assert out["estimate"] == 0.7 and out["plus_minus"] == 0.1
    assert out["reading"] == "middle band"
    assert out["ece"] == pytest.approx(ece(conf, np.array([True, True, False, True])))
    res.calibration = None
    assert "ece" not in harness.estimate_scored(res, y)


def test_one_row_per_rule_that_printed_the_estimate(coverage, tmp_path):
    cells = tmp_path / "cells"
    for i, err in enumerate([0.01, -0.02, 0.03, 0.04]):
        _cell(cells, f"m-s{i}", {"accuracy": 0.9, "estimate": 0.9 + err, "plus_minus": 0.035,
                                 "reading": "midway (sure labels)"})
    _cell(cells, "l-s0", {"accuracy": 0.2, "estimate": 0.35, "plus_minus": 0.25,
                          "reading": "lowest band"})
    _cell(cells, "o-s0", {"accuracy": 0.5, "estimate": 0.55, "plus_minus": 0.1})  # older cell
    rows = coverage.by_reading_rows("bench", coverage.readings(cells))
    cols = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    assert cols[0] == ["bench", "midway (sure labels)", "4", "3", "2.5", "4.0", "3.5"]
    assert sorted(c[1] for c in cols[1:]) == ["lowest band", "unrecorded"]
    low = next(c for c in cols if c[1] == "lowest band")
    assert low[2:] == ["1", "1", "15.0", "15.0", "25.0"]
