"""Click defaults are read from the settings dataclasses, not restated (issue 34, item 3): every
option of ``mrtf refine`` named as a RefineConfig field, and of ``mrtf simulate`` named as a
RunConfig field, has that field's default (None in ``simulate`` stands for "the config
file's, else RunConfig's"); the helper that builds such options (cli/defaults.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import click
import pytest
from click.testing import CliRunner

from mrtf.cli.defaults import field_default, field_option, option_name
from mrtf.cli.refine import refine_cmd, refine_config
from mrtf.cli.simulate import simulate
from mrtf.federated.run_config import RunConfig
from mrtf.refinery import RefineConfig

#: the refine options whose None means "RefineConfig's default" (``--steps``: data-free runs
#: read it as the student's steps, whose default is another)
LEFT_TO_THE_CONFIG = {"steps"}


def _params(command: click.Command, cls: type) -> dict[str, click.Parameter]:
    names = {f.name for f in fields(cls)}
    return {p.name: p for p in command.params if p.name in names}


def test_refine_options_have_refine_config_defaults():
    params = _params(refine_cmd, RefineConfig)
    # the settings a user sets on the command line are all there
    assert {"method", "variant", "steps", "batch_size", "lr", "tau", "clr_iterations",
            "clr_min_round", "class_prior", "neighbour_vote", "augment", "aggregate", "trust",
            "seed", "device", "stream"} <= set(params)
    for name, param in params.items():
        want = None if name in LEFT_TO_THE_CONFIG else field_default(RefineConfig, name)
        assert param.default == want, name
    # and the options, all left at their defaults, build RefineConfig's defaults
    ctx = refine_cmd.make_context("refine", ["received"])
    built = refine_config(ctx.params, progress=True)
    assert built == RefineConfig()


def test_simulate_options_have_run_config_defaults():
    params = _params(simulate, RunConfig)
    assert {"dataset", "clients", "split", "ratio", "rounds", "epochs", "lr", "batch_size",
            "mu", "arch", "target_size"} <= set(params)
    for name, param in params.items():
        if param.default is not None:  # None: the --config file's value, else RunConfig's
            assert param.default == field_default(RunConfig, name), name
    seed = next(p for p in simulate.params if p.name == "seed")
    assert [seed.default] == RunConfig().seeds


def test_refine_help_shows_the_config_defaults():
    res = CliRunner().invoke(refine_cmd, ["--help"], terminal_width=200)
    assert res.exit_code == 0
    assert f"[default: {RefineConfig().batch_size}]" in res.output
    assert f"Distillation steps (default {RefineConfig().steps};" in res.output


@dataclass
class _Settings:
    size: int = 3
    names: list = field(default_factory=lambda: ["a"])
    ratio: float = field(default=0.5, metadata={"help": "The ratio."})
    fast: bool = False
    where: str | None = None


def test_field_option_reads_default_and_help():
    @click.command()
    @field_option(_Settings, "--size", type=int)
    @field_option(_Settings, "--ratio", type=float)
    @field_option(_Settings, "--fast/--slow")
    @field_option(_Settings, "-w", "--where")
    def cmd(**kw):
        click.echo(repr(sorted(kw.items())))

    res = CliRunner().invoke(cmd, [])
    assert res.output.strip() == repr([("fast", False), ("ratio", 0.5), ("size", 3),
                                       ("where", None)])
    help_text = CliRunner().invoke(cmd, ["--help"], terminal_width=200).output
    assert "The ratio.  [default: 0.5]" in help_text and "[default: 3]" in help_text
    assert field_default(_Settings, "names") == ["a"]
    assert option_name(("--trust/--no-trust", "trust")) == "trust"
    assert option_name(("-K", "--batch-size")) == "batch_size"
    with pytest.raises(TypeError, match="no field 'nope'"):
        field_default(_Settings, "nope")
