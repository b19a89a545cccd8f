"""Issue 15.8: one round numbering (from 1, as the papers count) across the console, --json,
`inspect` and the files' metadata; old 0-based files are still read."""

from __future__ import annotations

import json

import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from mrtf.cli.main import cli
from mrtf.io import load_bundle
from mrtf.io.readers import peek_safetensors

SIM = ["simulate", "--dataset", "digits", "--clients", "4", "--split", "iid", "--ratio", "0.5",
       "--rounds", "2", "--local-steps", "2", "--target-size", "100", "--seed", "0"]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_console_json_inspect_and_metadata_agree(tmp_path):
    res = run(*SIM, "--export-received", tmp_path / "recv", "--export-target", tmp_path / "t.h5")
    assert res.exit_code == 0, res.output
    assert "round   1/2" in res.output and "round   2/2" in res.output
    summary = json.loads(run(*SIM, "--json").stdout)
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    client = sorted((tmp_path / "recv").glob("client-*.safetensors"))[0]
    head, _ = peek_safetensors(client)
    assert head["mrtf.round"] == "2" and head["mrtf.round_base"] == "1"
    inspected = json.loads(run("inspect", tmp_path / "recv", "--json").stdout)
    assert {m["round"] for m in inspected["models"]} == {2}
    assert json.loads(run("inspect", client, "--json").stdout)["round"] == 2
    res = run("refine", tmp_path / "recv", "--data", tmp_path / "t.h5", "--method", "fedavg",
              "--model", tmp_path / "r.safetensors", "--steps", "1", "--json")
    assert res.exit_code == 0, res.output
    assert {p["round"] for p in json.loads(res.stdout)["parties"]} == {2}
    # the refined model belongs to the round it refines
    assert peek_safetensors(tmp_path / "r.safetensors")[0]["mrtf.round"] == "2"
    # the evaluation engine counts the same way
    res = run(*SIM, "--methods", "fedavg", "--out", tmp_path / "run", "--json")
    assert [json.loads(x)["round"] for x in
            (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_old_zero_based_files_are_still_read(digits_federation, tmp_path):
    received, _, _ = digits_federation
    client = sorted(received.glob("client-*.safetensors"))[0]
    new = load_bundle(client)
    head, _ = peek_safetensors(client)
    old = {k: v for k, v in head.items() if k != "mrtf.round_base"}
    old["mrtf.round"] = str(new.meta.round)  # what earlier versions wrote: 0-based
    save_file({k: v.contiguous() for k, v in load_file(client).items()},
              tmp_path / "old.safetensors", metadata=old)
    legacy = load_bundle(tmp_path / "old.safetensors")
    assert legacy.meta.round == new.meta.round
    assert legacy.meta.round_number == new.meta.round_number == int(head["mrtf.round"])
    bad = {**head, "mrtf.round": "0"}  # a 1-based file cannot say round 0
    save_file({k: v.contiguous() for k, v in load_file(client).items()},
              tmp_path / "bad.safetensors", metadata=bad)
    res = run("inspect", tmp_path / "bad.safetensors")
    assert res.exit_code == 2 and "mrtf.round must be >= 1" in res.output
    assert torch.is_tensor(next(iter(legacy.state_dict.values())))
