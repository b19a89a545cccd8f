"""Issue 15.9: nothing is left out quietly. `refine` says which received files it uses and
which it does not (and why) before the work, and flags one party name on two files."""

from __future__ import annotations

import json
import shutil

from click.testing import CliRunner

from mrtf.cli.main import cli
from mrtf.federated import export_received
from mrtf.io import load_received
from mrtf.trust.parties import duplicate_parties, plan_parties


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _history_dir(digits_federation, tmp_path):
    _, _, result = digits_federation
    out = tmp_path / "recv"
    export_received(result, out, history=True)
    return out


def test_refine_lists_used_and_unused_files(digits_federation, tmp_path):
    recv = _history_dir(digits_federation, tmp_path)
    rows = plan_parties(load_received(recv), "refine")
    old = [r for r in rows if r.role == "local" and r.round == 1]  # 1-based
    new = [r for r in rows if r.role == "local" and r.round == 2]
    assert old and new and all(not r.used for r in old) and all(r.used for r in new)
    assert all("older than the newest round" in r.why for r in old)
    _, target, _ = digits_federation
    res = run("refine", recv, "--data", target, "--method", "feddf", "--steps", "2",
              "--labels", tmp_path / "l.h5")
    assert res.exit_code == 0, res.output
    assert f"parties used: {len(new) + 1} of {len(rows)} received files" in res.stdout
    for r in old:
        assert f"not used: {r.file}" in res.stderr
    data = json.loads(run("refine", recv, "--data", target, "--method", "feddf", "--steps",
                          "2", "--labels", tmp_path / "l.h5", "--force", "--json").stdout)
    assert {p["file"] for p in data["parties"] if not p["used"]} == {r.file for r in old}


def test_fedkf_uses_each_partys_latest_model(digits_federation, tmp_path):
    recv = _history_dir(digits_federation, tmp_path)
    rows = plan_parties(load_received(recv), "fedkf")
    used = [r for r in rows if r.used]
    assert len({r.party for r in used}) == len(used)  # one file per party
    assert all(r.role == "local" for r in used)
    assert {r.party for r in rows if r.role == "local"} == {r.party for r in used}


def test_duplicate_party_name_is_flagged(digits_federation, tmp_path):
    received, target, _ = digits_federation
    recv = tmp_path / "recv"
    shutil.copytree(received, recv)
    first = sorted(recv.glob("client-*.safetensors"))[0]
    shutil.copy(first, recv / "copy-of-a-client.safetensors")
    assert len(duplicate_parties(load_received(recv))) == 1
    res = run("refine", recv, "--data", target, "--method", "fedavg", "--steps", "1",
              "--labels", tmp_path / "l.h5")
    assert res.exit_code == 0, res.output
    assert "sent 2 files of round" in res.stderr and "copy-of-a-client" in res.stderr
