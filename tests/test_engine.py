"""One round engine (mrtf.federated.engine): the plain simulation is the evaluation run's FedAvg
track, and exporting what a pilot party receives is a listener of any run."""

from __future__ import annotations

import json

import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from mrtf.cli.main import cli
from mrtf.federated import ExportReceived, RunConfig, average_received, simulate
from mrtf.federated.engine import RoundEvent, select_clients
from mrtf.federated.runner import run
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


def test_every_method_can_export_its_received_models(tmp_path):
    cfg = RunConfig(dataset="digits", clients=4, split="label:3", ratio=0.5, rounds=2,
                    local_steps=2, arch="mlp", target_size=100, methods=["feddf", "fedkf"],
                    seeds=[0], refine_steps=2, fusion_batch=8)
    export = ExportReceived(tmp_path / "recv", history=True, per_track=True)
    seen: list[RoundEvent] = []

    class Watch:
        def on_round_end(self, event: RoundEvent) -> None:
            seen.append(event)

    run(cfg, tmp_path / "run", listeners=[export, Watch()])
    assert [(e.method, e.round, e.last) for e in seen] == [
        ("feddf", 0, False), ("feddf", 1, True), ("fedkf", 0, False), ("fedkf", 1, True)]
    trained = {k for r in range(2) for k in select_clients(0, r, 4, 2)}
    for method in ("feddf", "fedkf"):
        rs = load_received(tmp_path / "recv" / f"s0-{method}")
        assert {m.name for m in rs.by_role("local")} == {f"client-{k:03d}" for k in trained}
        assert len(rs.by_role("global")) == 1
    # the in-memory track of the same seed and method is the same federation
    mem = simulate(cfg, method="feddf")
    assert [r["accuracy"] for r in mem.records] == [e.record["accuracy"] for e in seen[:2]]


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
