"""`mrtf simulate --config/--methods/--out` and `mrtf report` end to end on digits."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mrtf.cli.main import cli

TOML = """
dataset = "digits"
clients = 6
split = "label:2"
ratio = 0.5
rounds = 2
local_steps = 3
arch = "lenet"
target_size = 200
methods = ["fedavg", "mrtf"]
seeds = [0, 1]
refine_steps = 5
"""


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def cfg_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("cliruns")
    (root / "run.toml").write_text(TOML + f'out = "{root / "run"}"\n')
    # the command line overrides the file: --methods and --rounds
    res = run("simulate", "--config", root / "run.toml", "--methods", "fedavg,feddf",
              "--rounds", "1", "--json")
    assert res.exit_code == 0, res.output
    return root, json.loads(res.output)


def test_flags_override_config(cfg_run):
    root, summary = cfg_run
    config = json.loads((root / "run" / "config.json").read_text())
    assert config["methods"] == ["fedavg", "feddf"] and config["rounds"] == 1
    assert config["seeds"] == [0, 1] and config["clients"] == 6
    assert set(summary["summary"]) == {"fedavg", "feddf"}
    lines = (root / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4  # 2 methods × 2 seeds × 1 round


def test_report_rerenders(cfg_run):
    root, _ = cfg_run
    (root / "run" / "summary.md").unlink()
    (root / "run" / "accuracy.png").unlink()
    res = run("report", root / "run", "--json")
    assert res.exit_code == 0, res.output
    assert (root / "run" / "summary.md").is_file() and (root / "run" / "accuracy.png").is_file()
    assert set(json.loads(res.output)["summary"]) == {"fedavg", "feddf"}


def test_flags_only_run_and_resume(tmp_path):
    args = ["simulate", "--dataset", "digits", "--clients", "6", "--split", "label:2",
            "--ratio", "0.5", "--rounds", "1", "--local-steps", "2", "--target-size", "100",
            "--methods", "fedavg", "--seeds", "0", "--out", tmp_path / "r", "-q"]
    assert run(*args).exit_code == 0
    assert run(*args).exit_code == 2  # the directory holds a run
    assert run(*args, "--resume").exit_code == 0  # complete: re-rendered, nothing rerun


@pytest.mark.parametrize("extra, message", [
    (["--methods", "fedavg,nope"], "unknown method"),
    (["--methods", "fedavg", "--dataset", "nope"], "unknown dataset"),
    (["--methods", "fedavg", "--clients", "4", "--ratio", "0.1"], "R·K < 1"),
    (["--methods", "fedavg", "--dp-sigma", "-1"], "σ"),
    (["--methods", "fedavg", "--target", "nope"], "unknown target"),
    (["--seeds", "0,1"], "needs an evaluation run"),
    (["--config", "missing.toml"], "not found"),
])
def test_bad_input_exits_2(tmp_path, extra, message):
    res = CliRunner().invoke(cli, ["simulate", "--dataset", "digits", "--out",
                                   str(tmp_path / "o"), *extra]
                             if extra[0] != "--seeds" else ["simulate", *extra])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_other_run_in_out_dir_is_refused(cfg_run):
    root, _ = cfg_run
    res = CliRunner().invoke(cli, ["simulate", "--config", str(root / "run.toml"), "--resume"])
    assert res.exit_code == 2 and "different run" in res.output


def test_sigkill_then_resume_equals_uninterrupted(tmp_path):
    """A real `mrtf simulate` process killed with SIGKILL right after its first checkpoint,
    started again with the same command plus --resume, ends with the uninterrupted metrics."""
    import os
    import signal
    import subprocess
    import sys
    import time

    args = ["simulate", "--dataset", "digits", "--clients", "6", "--split", "label:2",
            "--ratio", "0.5", "--rounds", "4", "--eval-every", "2", "--local-steps", "3",
            "--target-size", "200", "--methods", "fedavg,mrtf,fedkf", "--seeds", "0",
            "--refine-steps", "5", "--clr-min-round", "1", "--fusion-batch", "16", "-q"]
    import torch

    full = run(*args, "--out", tmp_path / "full")
    assert full.exit_code == 0, full.output
    out = tmp_path / "killed"
    # The thread count changes float results (reduction order), so the killed process runs
    # with exactly the in-process thread count, whatever OMP_NUM_THREADS says.
    threads = torch.get_num_threads()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    code = (f"import torch; torch.set_num_threads({threads}); "
            "from mrtf.cli.main import cli; cli()")
    proc = subprocess.Popen([sys.executable, "-c", code, *args, "--out", str(out)], env=env)
    # generous: a loaded 2-core machine is slow to import torch and train the first rounds
    deadline = time.monotonic() + 600
    while not list((out / "ckpt").glob("*.json")) and proc.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint within 600 s"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (out / "summary.md").exists()
    resumed = run(*args, "--out", out, "--resume")
    assert resumed.exit_code == 0, resumed.output

    def lines(d):
        recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k not in ("seconds", "elapsed")} for r in recs]

    assert lines(out) == lines(tmp_path / "full")
    assert [r["round"] for r in lines(out)] == [2, 4] * 3


def test_resume_from_the_run_directory_alone(tmp_path):
    """Issue 15.4: `--out DIR --resume` without the original flags reads DIR's config."""
    from mrtf.federated.runner import RunConfig, RunHooks
    from mrtf.federated.runner import run as run_engine

    cfg = RunConfig(dataset="digits", clients=6, split="label:2", ratio=0.5, rounds=3,
                    local_steps=2, target_size=100, methods=["fedavg", "feddf"],
                    refine_steps=3, seeds=[0])
    full = run_engine(cfg, tmp_path / "full")
    killed = run_engine(cfg, tmp_path / "killed", hooks=RunHooks(halt_after=2))
    assert killed.summary == {}  # as if killed
    res = run("simulate", "--out", tmp_path / "killed", "--resume")
    assert res.exit_code == 0, res.output
    assert res.output.startswith("evaluation run digits: K=6 split=label:2")  # not defaults
    strip = [{k: v for k, v in r.items() if k not in ("seconds", "elapsed")}
             for r in full.records]
    lines = (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
    assert [{k: v for k, v in json.loads(x).items() if k not in ("seconds", "elapsed")}
            for x in lines] == strip
    # a flag given again must agree with the saved run
    res = run("simulate", "--out", tmp_path / "killed", "--resume", "--rounds", "4")
    assert res.exit_code == 2 and "different run" in res.output


def test_a_running_run_directory_is_locked(tmp_path):
    from mrtf.io.outputs import locked_dir

    args = ["simulate", "--dataset", "digits", "--clients", "4", "--split", "iid", "--ratio",
            "0.5", "--rounds", "1", "--local-steps", "1", "--target-size", "100",
            "--methods", "fedavg", "--out", tmp_path / "r", "-q"]
    assert run(*args).exit_code == 0
    before = (tmp_path / "r" / "metrics.jsonl").read_text()
    with locked_dir(tmp_path / "r"):  # another process is writing it
        res = run("simulate", "--out", tmp_path / "r", "--resume")
    assert res.exit_code == 2 and "another mrtf run is writing" in res.output
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == before
    assert run("simulate", "--out", tmp_path / "r", "--resume", "-q").exit_code == 0
    # a refused new run leaves no directory behind
    res = run(*args[:-3], "--methods", "nope", "--out", tmp_path / "new")
    assert res.exit_code == 2 and not (tmp_path / "new").exists()


def test_recorded_mu_matches_the_help(tmp_path):
    """Issue 15.11: config.toml records the μ that --help states as the default."""
    res = run("simulate", "--dataset", "digits", "--clients", "4", "--split", "iid", "--ratio",
              "0.5", "--rounds", "1", "--local-steps", "1", "--target-size", "100",
              "--methods", "fedavg", "--out", tmp_path / "r", "-q")
    assert res.exit_code == 0, res.output
    assert "mu = 0.0\n" in (tmp_path / "r" / "config.toml").read_text()
    assert "--mu FLOAT" in run("simulate", "--help").output
    assert "default: 0.0" in " ".join(run("simulate", "--help").output.split())


def test_export_works_with_run_options(tmp_path):
    """Issue 15.11: a DP, FedProx, cross-domain federation can be exported for `refine`."""
    res = run("simulate", "--dataset", "digits", "--clients", "4", "--split", "iid",
              "--ratio", "0.5", "--rounds", "2", "--local-steps", "2", "--target-size", "100",
              "--dp-sigma", "0.001", "--dp-clip", "5", "--local-algorithm", "fedprox",
              "--mu", "0.01", "--target", "mnist5k", "--export-received", tmp_path / "recv",
              "--export-target", tmp_path / "t.h5", "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["config"]["dp_sigma"] == 0.001 and summary["config"]["target"] == "mnist5k"
    files = sorted(p.name for p in (tmp_path / "recv").iterdir())
    assert len(files) == 3 and "global-start.safetensors" in files  # 2 of 4 clients + θ_t
    from mrtf.io import H5Dataset

    with H5Dataset(tmp_path / "t.h5") as ds:  # mnist5k digits brought to digits' 1×8×8
        assert len(ds) == 100 and ds.sample_shape == (1, 8, 8)
    res = run("refine", tmp_path / "recv", "--data", tmp_path / "t.h5", "--method", "fedavg",
              "--labels", tmp_path / "l.h5", "--steps", "1", "-q")
    assert res.exit_code == 0, res.output
