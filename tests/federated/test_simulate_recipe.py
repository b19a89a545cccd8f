"""``mrtf simulate --recipe shot`` end to end on small real data (scikit-learn digits)."""

import json

from click.testing import CliRunner

from mrtf.cli.main import cli
from mrtf.io import load_received


def test_simulate_with_the_shot_recipe(tmp_path):
    args = ["simulate", "--dataset", "digits", "--clients", "2", "--split", "iid", "--ratio",
            "1.0", "--recipe", "shot", "--local-steps", "3", "--target-size", "100",
            "--export-received", str(tmp_path / "rx"), "--json"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    config = json.loads(res.output.strip().splitlines()[-1])["config"]
    assert (config["arch"], config["label_smoothing"], config["lr_decay"]) == \
        ("lenet_shot", 0.1, "inverse")
    assert config["local_steps"] == 3 and config["batch_size"] == 64
    received = load_received(tmp_path / "rx")
    assert {m.meta.arch for m in received.models} == {"lenet_shot"}
    # a flag given on the command line wins over the recipe
    res = CliRunner().invoke(cli, args[:-3] + ["--lr", "0.02", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.strip().splitlines()[-1])["config"]["lr"] == 0.02


def test_unknown_recipe_is_one_clear_line():
    res = CliRunner().invoke(cli, ["simulate", "--recipe", "fast"])
    assert res.exit_code == 2 and "fast" in res.output
