"""Exporting what a pilot party receives (mrtf.federated.export): a listener of any run."""

from __future__ import annotations

from mrtf.federated import ExportReceived, RunConfig, simulate
from mrtf.federated.engine import RoundEvent, select_clients
from mrtf.federated.runner import RunHooks, run
from mrtf.io import load_received


def test_every_method_can_export_its_received_models(tmp_path):
    cfg = RunConfig(dataset="digits", clients=4, split="label:3", ratio=0.5, rounds=2,
                    local_steps=2, arch="mlp", target_size=100, methods=["feddf", "fedkf"],
                    seeds=[0], refine_steps=2, fusion_batch=8)
    export = ExportReceived(tmp_path / "recv", history=True, per_track=True)
    seen: list[RoundEvent] = []

    class Watch:
        def on_round_end(self, event: RoundEvent) -> None:
            seen.append(event)

    run(cfg, tmp_path / "run", hooks=RunHooks(listeners=[export, Watch()]))
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
