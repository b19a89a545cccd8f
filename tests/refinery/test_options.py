"""A method's own options (issue 34, item 3): defined once as the registered method's
``settings``, given for one run as ``RefineConfig.method_options`` (checked in validate),
read by the method from ``config.options``; ``KEY=VALUE`` text (``mrtf refine --option``)
parsed against the settings' fields (mrtf/refinery/options.py)."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, replace

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from mrtf.cli.main import cli
from mrtf.errors import InputError
from mrtf.io.bundles import load_received
from mrtf.io.hdf5 import H5Dataset
from mrtf.io.labels import read_labels
from mrtf.refinery import RefineConfig, refine
from mrtf.refinery.aad import AadSettings, aad_adapt
from mrtf.refinery.decision import DecisionSettings
from mrtf.refinery.methods.adaptive import AdaptiveSettings
from mrtf.refinery.nrc import NrcSettings
from mrtf.refinery.options import method_options, methods_with_options, option_keys
from mrtf.refinery.registry import METHOD_SPECS
from mrtf.refinery.shot import ShotSettings
from mrtf.refinery.teachers import predict_probs


def test_defaults_are_the_registered_methods_settings():
    want = {"shot": ShotSettings.paper(), "aad": AadSettings(), "nrc": NrcSettings(),
            "decision": DecisionSettings()}
    for name, settings in want.items():
        config = RefineConfig(method=name)
        assert config.method_options is None
        assert config.options is METHOD_SPECS[name].settings and config.options == settings
        config.validate()
    assert RefineConfig().options == AdaptiveSettings(adapt_vote=False)
    assert RefineConfig(method="mrtf").options is None  # the paper's methods have none
    assert methods_with_options() == ["adaptive (AdaptiveSettings)", "shot (ShotSettings)",
                                      "aad (AadSettings)", "nrc (NrcSettings)",
                                      "decision (DecisionSettings)"]


def test_text_sets_fields_of_the_methods_defaults():
    assert method_options("decision", []) is None
    assert method_options("decision", ["sample_budget=20000", "max-epochs=3"]) == \
        DecisionSettings(sample_budget=20_000, max_epochs=3)
    # shot's base is its registered recipe (SHOT's paper), not ShotSettings()
    assert method_options("shot", ["epochs=10"]) == ShotSettings.paper(epochs=10)
    assert method_options("nrc", ["r=0.5", "k=3", "k=4"]) == NrcSettings(r=0.5, k=4)
    assert method_options("shot", ["lr=1e-3", "optimizer=adam"]) == \
        replace(ShotSettings.paper(), lr=1e-3, optimizer="adam")
    assert "sample_budget" in option_keys("decision") and option_keys("mrtf") == []
    assert option_keys("adaptive") == ["adapt_vote"]
    # the class shares of SHOT, NRC and DECISION come from --class-frequencies, not --option
    assert "class_prior" not in option_keys("shot") and "epochs" in option_keys("shot")
    assert "class_prior" not in option_keys("nrc") and "eps" in option_keys("nrc")
    assert "class_prior" not in option_keys("decision") and "beta" in option_keys("decision")
    assert method_options("adaptive", ["adapt-vote=yes"]) == AdaptiveSettings(adapt_vote=True)


@pytest.mark.parametrize("method, given, match", [
    ("mrtf", ["k=3"], "method mrtf takes no options"),
    ("adaptive", ["k=3"], "KEY one of adapt_vote"),
    ("adaptive", ["adapt_vote=maybe"], "adapt_vote: true or false"),
    ("aad", ["q=3"], "KEY one of alpha, batch_size, beta, epochs, k, lr"),
    ("aad", ["k"], "give KEY=VALUE"),
    ("shot", ["class_prior=0.5,0.5"], "give KEY=VALUE, KEY one of"),
    ("nrc", ["class_prior=0.5,0.5"], "give KEY=VALUE, KEY one of"),
    ("decision", ["class_prior=0.5,0.5"], "give KEY=VALUE, KEY one of"),
    ("aad", ["k=3.5"], "k: an integer, got '3.5'"),
    ("aad", ["lr=fast"], "lr: a number"),
    ("nope", ["k=1"], "unknown method 'nope'"),
])
def test_bad_text_is_one_clear_error(method, given, match):
    with pytest.raises(InputError, match=match):
        method_options(method, given)


def test_config_checks_the_options_once():
    RefineConfig(method="aad", method_options=AadSettings(k=2)).validate()
    with pytest.raises(InputError, match="method mrtf takes no method options"):
        RefineConfig(method="mrtf", method_options=AadSettings()).validate()
    with pytest.raises(InputError, match="options of method adaptive are a AdaptiveSettings"):
        RefineConfig(method_options=AadSettings()).validate()
    with pytest.raises(InputError, match="options of method aad are a AadSettings, got "
                                         "NrcSettings"):
        RefineConfig(method="aad", method_options=NrcSettings()).validate()
    with pytest.raises(InputError, match="DECISION: batch_size must be >= 1"):
        RefineConfig(method="decision",
                     method_options=DecisionSettings(batch_size=0)).validate()
    with pytest.raises(InputError, match="AaD"):  # the options' own checks
        RefineConfig(method="aad", method_options=AadSettings(k=0)).validate()


def test_the_method_runs_with_the_configs_options(digits_federation, tmp_path):
    """Library and CLI: aad with k=2 and one epoch, the same labels as the adapter run by
    hand with those settings; the run records them."""
    torch.set_num_threads(1)
    received, target_path = digits_federation[:2]
    mine = AadSettings(k=2, epochs=1)
    models = load_received(received)
    with H5Dataset(target_path) as target:
        average = refine(models, target, RefineConfig(method="fedavg", progress=False)).model
        r = refine(models, target, RefineConfig(method="aad", method_options=mine, seed=1,
                                                progress=False))
        by_hand = aad_adapt(copy.deepcopy(average), target, mine, 1, "cpu")
        np.testing.assert_allclose(r.probs, predict_probs(by_hand, target), atol=1e-6)
    assert any(line.startswith(f"aad: {mine}") for line in r.notes)
    assert r.to_dict()["config"]["method_options"] == asdict(mine)
    labels = tmp_path / "labels.h5"
    res = CliRunner().invoke(cli, ["refine", str(received), "--data", str(target_path),
                                   "--labels", str(labels), "--method", "aad", "--seed", "1",
                                   "--option", "k=2", "--option", "epochs=1", "--json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert np.array_equal(read_labels(labels).labels, r.probs.argmax(1))
    assert any(line.startswith(f"aad: {mine}") for line in json.loads(res.stdout)["notes"])
    with h5py.File(labels) as f:  # the labels file records the settings the run used
        assert json.loads(f.attrs["config"])["method_options"] == asdict(mine)
    bad = CliRunner().invoke(cli, ["refine", str(received), "--data", str(target_path),
                                   "--method", "mrtf", "--option", "k=2"])
    assert bad.exit_code == 2 and "method mrtf takes no options" in bad.output


def test_the_cli_asks_the_default_to_adapt_its_vote(digits_federation, tmp_path):
    """``mrtf refine --option adapt_vote=true`` on real digits: the run records the option,
    and step 5's line says what became of the vote (adapted, or kept where the adaptation
    merged classes); without it the default votes on this federation."""
    received, target_path = digits_federation[:2]
    runs = {}
    for name, extra in (("default", []), ("asked", ["--option", "adapt_vote=true"])):
        res = CliRunner().invoke(cli, ["refine", str(received), "--data", str(target_path),
                                       "--labels", str(tmp_path / f"{name}.h5"), "--json",
                                       "--steps", "40", *extra], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        runs[name] = json.loads(res.stdout)
    assert runs["default"]["branch"]["by"] == "vote"
    with h5py.File(tmp_path / "asked.h5") as f:
        assert json.loads(f.attrs["config"])["method_options"] == {"adapt_vote": True}
    assert runs["asked"]["branch"]["by"] in ("vote, then adapted", "collapsed adaptation")
