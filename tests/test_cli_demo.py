"""`mrtf demo` end to end on real (small) data: the default beside the paper's methods."""

from __future__ import annotations

import json

from click.testing import CliRunner

from mrtf.cli.main import cli


def test_demo_prints_the_default_beside_fedavg_feddf_and_paper_mrtf(tmp_path):
    res = CliRunner().invoke(cli, ["demo", "--dataset", "digits", "--rounds", "1", "--steps",
                                   "5", "--out", str(tmp_path / "demo"), "--json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert set(summary["accuracy"]) == {"fedavg", "feddf", "mrtf", "adaptive"}
    assert all(0.0 <= a <= 1.0 for a in summary["accuracy"].values())
    assert (tmp_path / "demo" / "labels-adaptive.h5").is_file()
