"""Defaults are defined once (issue 34, item 3): the refinery's schedule, the simulator's
refinery methods, the Flower config and the Flower app's run config agree, and the one copy
that cannot be derived (the app's pyproject.toml, read by Flower) is checked here."""

from __future__ import annotations

from dataclasses import fields

from mrtf.cli.simulate import simulate
from mrtf.engines.flower import APP_DIR
from mrtf.engines.flower.config import FlowerConfig
from mrtf.federated.local import LOCAL_BATCH_SIZE, LocalConfig
from mrtf.federated.methods import MethodSettings
from mrtf.federated.run_config import RunConfig
from mrtf.refinery.config import CLR_MIN_ROUND, RefineConfig
from mrtf.refinery.distill import BATCH_SIZE, STEPS, DistillRun
from mrtf.refinery.shot import ShotSettings


def test_refinery_schedule_is_one_definition():
    refine, run, method = RefineConfig(), DistillRun(), MethodSettings()
    assert refine.steps == run.steps == method.refine_steps == STEPS
    assert refine.batch_size == run.batch_size == BATCH_SIZE
    assert refine.clr_min_round == method.clr_min_round == CLR_MIN_ROUND
    # the adaptive default's SHOT branch runs the refinery's steps and batch (fit.py)
    assert ShotSettings().steps == STEPS and ShotSettings().batch_size == BATCH_SIZE


def test_flower_config_defaults_are_the_simulators():
    flower, run = FlowerConfig(), RunConfig()
    assert flower.settings() == MethodSettings()  # 0 in a run config stands for None
    for name in ("arch", "epochs", "lr", "batch_size", "mu", "eval_every"):
        assert getattr(flower, name) == getattr(run, name), name
    assert flower.pilot_method == RefineConfig().method
    assert (flower.method, flower.num_rounds, flower.seed) == (run.methods[0], run.rounds,
                                                               run.seeds[0])


def test_flower_app_run_config_states_the_same_defaults():
    """Flower reads the app's pyproject.toml, so its defaults are a copy: the same values."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    app = tomllib.loads((APP_DIR / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    given = {k.replace("-", "_"): v for k, v in app["config"].items()}
    defaults = FlowerConfig()
    assert given == {f.name: getattr(defaults, f.name) for f in fields(FlowerConfig)}


def test_local_update_defaults_are_one_definition():
    """LocalConfig, the simulator (``mrtf simulate``, ``mrtf demo``) and Flower: one local
    batch (16, measured: docs/benchmarks/demo-and-runs.md) and one client update."""
    assert LOCAL_BATCH_SIZE == 16
    assert LocalConfig().batch_size == RunConfig().batch_size == FlowerConfig().batch_size \
        == LOCAL_BATCH_SIZE
    assert RunConfig().local_config() == FlowerConfig().local_config() == LocalConfig()
    batch = next(p for p in simulate.params if p.name == "batch_size")
    assert batch.default == LOCAL_BATCH_SIZE
