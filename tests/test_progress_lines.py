"""Issue 15.2: when stderr is not a terminal (a log, CI), long work prints periodic plain
progress lines (stage, done/total, elapsed, ETA, latest numbers); --quiet removes them."""

from __future__ import annotations

import io
import time

import pytest
from click.testing import CliRunner

from mrtf.cli.main import cli
from mrtf.progress import LogBar, log_lines


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("mrtf: progress:")]


def test_refine_prints_progress_lines_and_quiet_removes_them(digits_federation, tmp_path,
                                                             monkeypatch):
    monkeypatch.setenv("MRTF_PROGRESS_SECONDS", "0")
    received, target, _ = digits_federation
    args = ["refine", received, "--data", target, "--method", "feddf", "--steps", "4",
            "--labels", tmp_path / "l.h5"]
    res = run(*args)
    assert res.exit_code == 0, res.output
    lines = _lines(res.stderr)
    distill = [line for line in lines if " distill " in line]
    assert distill and "4/4 steps" in distill[-1] and "elapsed" in distill[-1]
    assert any("ETA" in line and "loss" in line for line in distill)
    assert any("teachers" in line for line in lines)
    res = run(*args, "--force", "--quiet")
    assert res.exit_code == 0 and _lines(res.stderr) == [] and res.stderr == ""


def test_datafree_and_simulate_print_progress_lines(digits_federation, tmp_path, monkeypatch):
    monkeypatch.setenv("MRTF_PROGRESS_SECONDS", "0")
    received, _, _ = digits_federation
    res = run("refine", received, "--model", tmp_path / "f.safetensors", "--datafree",
              "fedftg", "--steps", "5")
    assert res.exit_code == 0, res.output
    assert any("FedFTG 1/1" in line for line in _lines(res.stderr))
    res = run("simulate", "--dataset", "digits", "--clients", "4", "--split", "iid",
              "--ratio", "0.5", "--rounds", "2", "--local-steps", "2", "--target-size", "100",
              "--methods", "fedavg", "--out", tmp_path / "run")
    assert res.exit_code == 0, res.output
    lines = _lines(res.stderr)
    assert any("2/2 rounds" in line and "accuracy" in line for line in lines)


def test_lines_are_rate_limited(monkeypatch):
    monkeypatch.setenv("MRTF_PROGRESS_SECONDS", "3600")
    monkeypatch.setattr(LogBar, "_last_line", float("-inf"))
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    bar = LogBar(total=1000, desc="work", unit="step")
    for _ in range(1000):
        bar.update(1)
    bar.close()
    assert _lines(err.getvalue()) == []  # a stage shorter than the interval says nothing
    monkeypatch.setenv("MRTF_PROGRESS_SECONDS", "0.05")
    bar = LogBar(total=3, desc="slow", unit="step")
    for _ in range(3):
        time.sleep(0.06)
        bar.update(1)
    bar.close()
    lines = _lines(err.getvalue())  # a line per interval, and one at the end
    assert [line.split()[3] for line in lines] == ["1/3", "2/3", "3/3"]


@pytest.mark.parametrize("enabled", [True, False])
def test_log_lines_swaps_tqdm_only_inside_the_block(enabled):
    import tqdm

    before = tqdm.tqdm
    with log_lines(enabled):
        assert (tqdm.tqdm is LogBar) == enabled  # CliRunner-less pytest stderr is no tty
    assert tqdm.tqdm is before
