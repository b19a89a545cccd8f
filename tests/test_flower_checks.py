"""The Flower engine's in-process parts: checks on what parties send, the roster, the run
config, and a Flower round's aggregation with bad parties (NaN weights, a wrong class count,
an error reply, no reply), all without starting Flower's servers."""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np
import pytest
import torch

from mrtf.engines.flower import APP_DIR, flwr_available
from mrtf.engines.flower.checks import (
    Expected,
    PartyRejected,
    check_metrics,
    check_state,
    client_update,
    enough_parties,
)
from mrtf.engines.flower.config import FlowerConfig, client_settings
from mrtf.engines.flower.roster import build_roster
from mrtf.engines.flower.selection import chosen_parties, sub_seed
from mrtf.errors import InputError
from mrtf.federated import methods
from mrtf.models import build_model

SHAPE = (1, 8, 8)


def lenet(classes: int = 10, seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = build_model("lenet", classes, in_channels=1, image_size=8)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def arrays(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.numpy().copy() for k, v in state.items()}


GOOD = {"n_samples": 30, "label_counts": [3] * 10, "train_loss": 1.5, "round": 1}


def test_selection_and_seeds_are_the_in_process_engines():
    assert sub_seed(3, 1, 2, "local") == methods.sub_seed(3, 1, 2, "local")
    # runner.py: sorted(default_rng([seed, rnd, 17]).choice(clients, per_round, False))
    want = sorted(np.random.default_rng([5, 2, 17]).choice(20, size=4, replace=False).tolist())
    assert chosen_parties(5, 2, 20, 4) == want


def test_a_good_reply_becomes_a_client_update():
    ref = lenet()
    u = client_update("party 1", 1, arrays(lenet(seed=1)), GOOD, Expected(ref, 10, 0))
    assert u.client == 1 and u.n_samples == 30 and u.train_loss == 1.5
    assert list(u.state) == list(ref) and torch.equal(u.state["body.0.weight"],
                                                      lenet(seed=1)["body.0.weight"])


@pytest.mark.parametrize("spoil, says", [
    (lambda a: a.__setitem__("body.0.weight", a["body.0.weight"] * np.nan), "NaN"),
    (lambda a: a.__setitem__("body.0.bias", np.full_like(a["body.0.bias"], 1e9)), "beyond"),
    (lambda a: a.pop("body.0.bias"), "lacks 'body.0.bias'"),
    (lambda a: a.__setitem__("extra", np.zeros(2, np.float32)), "unknown tensor 'extra'"),
    (lambda a: a.__setitem__("body.0.bias", a["body.0.bias"].astype(np.float64)), "dtype"),
    (lambda a: a.__setitem__("body.0.bias", a["body.0.bias"][:-1]), "shape"),
])
def test_bad_tensors_are_refused_naming_the_party(spoil, says):
    a = arrays(lenet())
    spoil(a)
    with pytest.raises(PartyRejected, match=f"^party 2: .*{says}"):
        check_state("party 2", a, lenet())


def test_a_model_for_another_class_count_is_refused():
    with pytest.raises(PartyRejected, match="party 0: tensor .* has shape"):
        check_state("party 0", arrays(lenet(classes=5)), lenet())


@pytest.mark.parametrize("change, says", [
    ({"label_counts": [6] * 5}, "reports 5 classes, the run has 10"),
    ({"label_counts": [3] * 9 + [4]}, "add up to 31"),
    ({"label_counts": "many"}, "no label counts"),
    ({"n_samples": 0}, "n_samples"),
    ({"train_loss": -1.0}, "train_loss"),
    ({"train_loss": float("inf")}, "train_loss"),
    ({"round": 3}, "answers round 3"),
])
def test_bad_metadata_is_refused(change, says):
    with pytest.raises(PartyRejected, match=says):
        check_metrics("party 4", {**GOOD, **change}, 10, 0)


def test_nan_loss_is_what_no_step_reports_and_is_kept():
    assert math.isnan(check_metrics("p", {**GOOD, "train_loss": float("nan")}, 10, 0)[2])


def test_too_few_parties_is_one_line():
    enough_parties(2, 2, "round 1")
    with pytest.raises(InputError, match="^round 3: 1 usable party, fewer than the minimum "
                                         "of 2 .*stopping$"):
        enough_parties(1, 2, "round 3")


def test_roster_leaves_out_what_does_not_fit_and_names_it():
    info = {"n_samples": 10, "sample_shape": list(SHAPE)}
    answers = [(11, {"partition_id": 0, **info}), (12, {"partition_id": 0, **info}),
               (13, {"partition_id": 7, **info}),
               (14, {"partition_id": 1, "n_samples": 10, "sample_shape": [3, 8, 8]}),
               (15, "did not answer within 5 s"), (16, {"partition_id": 2, **info})]
    roster, left = build_roster(answers, 3, SHAPE)
    assert roster.node_of == {0: 11, 2: 16} and roster.client_sizes(3) == [10, 0, 10]
    assert left == ["node 12: left out: party 0 is already node 11",
                    "node 13: left out: partition-id 7 is not in 0..2",
                    "party 1 (node 14): left out: its samples have shape (3, 8, 8), the model "
                    "takes (1, 8, 8)",
                    "node 15: left out: did not answer within 5 s"]


def test_run_config_keys_are_the_apps_and_checked():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    app = tomllib.loads((APP_DIR / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    keys = {k.replace("-", "_") for k in app["config"]}
    assert keys == {f.name for f in fields(FlowerConfig)}
    cfg = FlowerConfig.from_run_config({**app["config"], "target": "t.h5", "out": "o"})
    assert cfg.per_round == 3 and cfg.settings().refine_lr is None
    with pytest.raises(InputError, match="unknown key 'epoch'"):
        FlowerConfig.from_run_config({"epoch": 1})
    with pytest.raises(InputError, match="num-rounds must be an integer"):
        FlowerConfig.from_run_config({"num-rounds": "2"})
    with pytest.raises(InputError, match="min-parties must be in"):
        FlowerConfig.from_run_config({"target": "t", "out": "o", "min-parties": 9})
    with pytest.raises(InputError, match="lacks 'seed'"):
        client_settings({"method": "fedavg"})


# ------------------------------------------------------------ a round with Flower's records
needs_flwr = pytest.mark.skipif(not flwr_available(),
                                reason="needs flwr (pip install -e '.[flower]')")


def reply(node: int, msg_id: str, content=None, error=None):
    from flwr.app import Metadata
    from flwr.app.message import make_message

    meta = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0,
                    reply_to_message_id=msg_id, group_id="", created_at=0.0, ttl=60,
                    message_type="train")
    return make_message(meta, content=content, error=error)


@needs_flwr
def test_records_round_trip_exactly_and_are_checked_before_decoding():
    from flwr.app import Array, ArrayRecord

    from mrtf.engines.flower.records import from_record, to_record

    state = lenet(seed=3)
    back = from_record("p", to_record(state), lenet())
    assert all(torch.equal(back[k], state[k]) for k in state)
    rec = to_record(state)
    big = np.zeros(10**6, np.float32)
    rec["body.0.bias"] = Array(big)  # declared shape differs: refused before it is read
    with pytest.raises(PartyRejected, match="has shape \\(1000000,\\)"):
        from_record("p", rec, lenet())
    with pytest.raises(PartyRejected, match="sent no model"):
        from_record("p", None, lenet())
    assert isinstance(rec, ArrayRecord)


@needs_flwr
def test_a_round_leaves_bad_parties_out_names_them_and_goes_on(monkeypatch):
    from flwr.app import ConfigRecord, Error, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from mrtf.engines.flower.config import FlowerConfig
    from mrtf.engines.flower.records import metrics_record, to_record
    from mrtf.engines.flower.roster import Roster
    from mrtf.engines.flower.strategy import MrtfFlowerStrategy
    from mrtf.io.hdf5 import ArraySource

    for key in ("_run_id", "_node_id", "_task_id"):  # what a ServerApp process has set
        monkeypatch.setattr(TaskIdentity, key, 1, raising=False)
    rng = np.random.default_rng(0)
    target = rng.random((40, *SHAPE), dtype=np.float32)
    cfg = FlowerConfig(clients=5, target="t", out="o", min_parties=2, round_timeout=5.0)
    ctx = methods.ServerContext(arch="lenet", num_classes=10,
                                arch_kwargs={"in_channels": 1, "image_size": 8},
                                image_shape=SHAPE, target=ArraySource(target),
                                client_sizes=[30] * 5, seed=0, device=torch.device("cpu"),
                                settings=cfg.settings())
    init = lenet()
    said: list[str] = []
    roster = Roster({p: 100 + p for p in range(5)}, {p: 30 for p in range(5)})
    fl = MrtfFlowerStrategy(cfg, methods.make_strategy("fedavg", ctx), ctx, roster, init,
                            rng.integers(0, 10, 40), said.append)
    msgs = list(fl.configure_train(1, to_record(init), ConfigRecord(), None))
    assert [m.metadata.dst_node_id for m in msgs] == [100, 101, 102, 103, 104]
    good0, good4 = lenet(seed=1), lenet(seed=4)
    nan = {k: v * float("nan") for k, v in lenet(seed=2).items()}

    def content(state, counts=(3,) * 10):
        return RecordDict({"arrays": to_record(state),
                           "metrics": metrics_record(sum(counts), list(counts), 1.0, 0)})

    replies = [reply(100, "a", content(good0)), reply(101, "b", content(nan)),
               reply(102, "c", content(lenet(classes=5), (6,) * 5)),
               reply(103, "d", error=Error(code=2, reason="<class 'mrtf.errors.InputError'>:"
                                                         "<'party 3: its data has samples of "
                                                         "shape (3, 8, 8)'>")),
               reply(104, "e", content(good4))]  # party 4 answers; 3 did not train
    record, metrics = fl.aggregate_train(1, replies[:4] + replies[4:])
    left = [s for s in said if "left out" in s]
    assert any("party 1 (node 101): tensor 'body.0.weight' holds NaN" in s for s in left)
    assert any("party 2 (node 102): reports 5 classes" in s for s in left)
    assert any("party 3 (node 103): failed: party 3: its data has samples of shape" in s
               for s in left)
    avg = methods.make_strategy("fedavg", ctx).aggregate(0, init, [
        methods.ClientUpdate(0, good0, 30, [3] * 10, 1.0),
        methods.ClientUpdate(4, good4, 30, [3] * 10, 1.0)], True).state
    got = record.to_torch_state_dict()
    assert all(torch.equal(got[k], avg[k]) for k in avg)
    assert fl.records[-1]["parties"] == [0, 4]

    # the next round: only party 0 answers in time, party 4's reply never comes
    said.clear()
    fl.configure_train(2, record, ConfigRecord(), None)
    with pytest.raises(InputError, match="round 2: 1 usable party, fewer than the minimum"):
        fl.aggregate_train(2, [reply(100, "f", RecordDict({
            "arrays": to_record(good0),
            "metrics": metrics_record(30, [3] * 10, 1.0, 1)}))])
    assert any("party 4 (node 104) did not answer within 5 s; left out" in s for s in said)
