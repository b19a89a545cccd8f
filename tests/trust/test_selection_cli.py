"""`mrtf inspect` names the file whose claim refine would refuse (issue 35), on real digits
parties written to disk (the ``digits_oneshot`` fixture) plus an intruder."""

from __future__ import annotations

import shutil
from dataclasses import replace

from click.testing import CliRunner

from mrtf.cli.main import cli
from mrtf.io.bundles import load_bundle, save_bundle


def test_inspect_names_a_lone_round_claim(digits_oneshot, tmp_path):
    received, target = digits_oneshot
    recv = tmp_path / "received"
    shutil.copytree(received, recv)
    party = load_bundle(recv / "client-000.safetensors")
    state = dict(party.state_dict)
    last = [n for n, v in state.items() if v.dim() == 2][-1]
    for n in (last, last.replace("weight", "bias")):
        state[n] = state[n].roll(1, 0)  # the same model predicting y + 1
    save_bundle(recv / "intruder.safetensors", state,
                replace(party.meta, party="intruder", round=10**6 - 1))
    res = CliRunner().invoke(cli, ["inspect", str(recv), "--data", str(target)])
    assert res.exit_code == 0, res.output
    assert "not used: intruder.safetensors (intruder): claims round 1000000" in res.output
    # the reliability table covers the 6 honest parties of round 1, none flagged
    assert "(6 local models; y not used)" in res.output and "0 flagged: none" in res.output
    assert "refused: intruder.safetensors" in res.output
