"""The Flower pilot party's refine (mrtf/engines/flower/pilot.py): its run context is one typed
object (PilotRun), and the method's own options (``pilot-options``) reach the job exactly as
``mrtf refine --option`` gives them."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from mrtf.cli.main import cli
from mrtf.errors import InputError
from mrtf.refinery.decision import DecisionSettings

pytest.importorskip("flwr")

from mrtf.engines.flower.config import FlowerConfig  # noqa: E402
from mrtf.engines.flower.pilot import PilotRun, refine_args, refine_job  # noqa: E402


def test_pilot_run_is_a_frozen_record():
    run = PilotRun(FlowerConfig(), None, None, None, {}, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.cfg = FlowerConfig(seed=1)


def test_pilot_options_reach_the_job_as_the_command_gives_them(tmp_path, monkeypatch):
    import mrtf.cli.refine as refine_cli

    cfg = FlowerConfig(mode="pilot", target=str(tmp_path / "t.h5"), out=str(tmp_path),
                       pilot_method="decision", pilot_options="sample_budget=2000 lr=0.02")
    cfg.validate()
    job = refine_job(cfg, tmp_path / "received", tmp_path)
    assert job.config.options == DecisionSettings(sample_budget=2000, lr=0.02)
    args = refine_args(cfg, tmp_path / "received", tmp_path)
    assert args[-4:] == ["--option", "sample_budget=2000", "--option", "lr=0.02"]
    seen = []
    monkeypatch.setattr(refine_cli, "refine_files",
                        lambda job, reporter: seen.append(job) or (_ for _ in ()).throw(
                            InputError("captured")))
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and "captured" in res.stderr
    assert dataclasses.asdict(seen[0]) == dataclasses.asdict(job)


def test_bad_pilot_options_are_a_run_config_error(tmp_path):
    cfg = FlowerConfig(mode="pilot", target="t.h5", out="o", pilot_method="decision",
                       pilot_options="budget=1")
    with pytest.raises(InputError, match="run config: pilot-options: --option 'budget=1'"):
        cfg.validate()
    assert FlowerConfig().method_options() is None
