"""One round engine (mrtf.federated.engine): the plain simulation is the evaluation run's FedAvg
track (and both refuse a target the models cannot take)."""

from __future__ import annotations

import json

import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from mrtf.cli.main import cli
from mrtf.federated import RunConfig, average_received, simulate
from mrtf.io import load_received

FLAGS = ["--dataset", "digits", "--clients", "4", "--split", "label:3", "--ratio", "0.5",
         "--rounds", "2", "--local-steps", "3", "--arch", "mlp", "--target-size", "100"]


def test_plain_simulate_exports_the_evaluation_runs_fedavg_model(tmp_path):
    cli_run = CliRunner().invoke
    plain = cli_run(cli, ["simulate", *FLAGS, "--seed", "3", "--export-received",
                          str(tmp_path / "recv"), "--json"], catch_exceptions=False)
    assert plain.exit_code == 0, plain.output
    evaluation = cli_run(cli, ["simulate", *FLAGS, "--methods", "fedavg", "--seeds", "3",
                               "--out", str(tmp_path / "run"), "-q"], catch_exceptions=False)
    assert evaluation.exit_code == 0, evaluation.output
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines]
    assert [r["accuracy"] for r in json.loads(plain.stdout)["rounds"]] == \
        [r["accuracy"] for r in rows]
    # the sample-weighted average of the exported locals is the run's final global model
    avg, _ = average_received(load_received(tmp_path / "recv").by_role("local"))
    final = load_file(str(tmp_path / "run" / "ckpt" / "s3-fedavg.r2.safetensors"))
    for key, value in avg.state_dict().items():
        torch.testing.assert_close(value, final[f"global.{key}"])


def test_a_target_that_does_not_fit_is_refused_in_memory_too(tmp_path):
    import numpy as np
    import pytest

    from mrtf.errors import InputError
    from mrtf.io.hdf5 import write_dataset

    bad = tmp_path / "two-channels.h5"
    write_dataset(bad, np.zeros((20, 2, 8, 8), np.float32), np.zeros(20, np.int64))
    cfg = RunConfig(dataset="digits", clients=4, ratio=0.5, target=str(bad), target_size=10)
    with pytest.raises(InputError, match="channels"):
        simulate(cfg)
