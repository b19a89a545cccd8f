"""The ClientApp: a party trains on its own shard and reports its model and counts.

Messages it answers:

* ``query``: who it is (``partition-id``), how many samples, their shape: the server's roster.
* ``train``: θ_t (``arrays``) and the settings (``config``); it trains exactly as the in-process
  engine trains party k in round t (same seed, same order of random draws) and replies with
  its model (``arrays``) and ``metrics`` (n_samples, label_counts, train_loss, round). FedKF's
  client half runs here: the server adds the OCA teacher (``teacher``) and the party's
  generator persists in the node's ``context.state`` between rounds.

A party with a trained model already (``--node-config 'model="party.safetensors"'``) answers a
pilot party's train message with that model instead of training.

Errors (data that does not fit the model, a bad message) are raised as one-line InputErrors:
Flower sends them back as the reply's error, and the server names the party and leaves it out.
"""

from __future__ import annotations

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from mrtf.device import pick_device
from mrtf.engines.flower.config import client_settings
from mrtf.engines.flower.records import from_record, metrics_record, to_record
from mrtf.engines.flower.selection import local_seed
from mrtf.engines.flower.shard import Shard, check_fits, load_shard
from mrtf.errors import InputError
from mrtf.federated.local import LocalConfig, LocalResult, local_train
from mrtf.federated.methods import MethodSettings, ServerContext, make_strategy
from mrtf.models import build_model, image_kwargs

GENERATOR_KEY = "mrtf.fedkf_generator"

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    shard = load_shard(dict(context.node_config))
    info = ConfigRecord({"partition_id": shard.party, "n_samples": len(shard.y),
                         "sample_shape": list(shard.sample_shape)})
    return Message(RecordDict({"party": info}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    node = dict(context.node_config)
    config = msg.content.config_records.get("config")
    if config is None:
        raise InputError("the server's train message has no config")
    s = client_settings(dict(config))
    rnd, image_shape = _int(config, "round"), tuple(_int_list(config, "image_shape"))
    if s["threads"]:
        torch.set_num_threads(s["threads"])
    if "model" in node:  # a party that trained already: its model, as a pilot party asks
        return _own_model(msg, node, s, rnd)
    shard = load_shard(node)
    check_fits(shard, image_shape, s["num_classes"])
    if _int(config, "party") != shard.party:
        raise InputError(f"the server addressed party {_int(config, 'party')}, this node is "
                         f"party {shard.party}")
    kwargs = image_kwargs(s["arch"], image_shape[0], image_shape[-1], config.get("norm") or None)
    # every module is built before the seed is set: building draws from torch's global RNG,
    # and the in-process engine builds nothing between seeding and training
    model = build_model(s["arch"], s["num_classes"], **kwargs)
    model.load_state_dict(from_record("the server's model", msg.content.array_records.get(
        "arrays"), model.state_dict()))
    strategy = None
    if s["method"] == "fedkf":
        strategy = _fedkf(msg, context, s, shard, image_shape, kwargs, model)
    local = LocalConfig(epochs=s["epochs"], steps=s["local_steps"] or None, lr=s["lr"],
                        batch_size=s["batch_size"], mu=s["mu"])
    seed = local_seed(s["seed"], rnd, shard.party)
    torch.manual_seed(seed)
    dev = pick_device(None)
    res: LocalResult | None = None
    if strategy is not None:
        res = strategy.client_update(rnd, shard.party, model, shard.x, shard.y, local, seed)
        if shard.party in strategy.generators:
            gen = strategy.generators[shard.party]
            context.state[GENERATOR_KEY] = to_record(gen.state_dict())
    if res is None:
        res = local_train(model, shard.x, shard.y, s["num_classes"], local, seed=seed,
                          device=dev)
    content = RecordDict({"arrays": to_record(res.model.state_dict()),
                          "metrics": metrics_record(res.n_samples, res.label_counts,
                                                    res.train_loss, rnd)})
    return Message(content, reply_to=msg)


def _fedkf(msg: Message, context: Context, s: dict, shard: Shard, image_shape: tuple,
           kwargs: dict, model: torch.nn.Module):
    """FedKF's strategy object on the client: the OCA teacher from the message, this party's
    generator from the node's state (built before the round's seed is set)."""
    ctx = ServerContext(arch=s["arch"], num_classes=s["num_classes"], arch_kwargs=kwargs,
                        image_shape=tuple(int(v) for v in image_shape), target=None,
                        client_sizes=[], seed=s["seed"], device=pick_device(None),
                        settings=MethodSettings(fusion_batch=s["fusion_batch"] or None,
                                                fedkf_kd_from_round=s["fedkf_kd_from_round"],
                                                fedkf_oca=s["fedkf_oca"]))
    strategy = make_strategy("fedkf", ctx)
    strategy.oca = from_record("the server's OCA teacher", msg.content.array_records.get(
        "teacher"), model.state_dict())
    saved = context.state.array_records.get(GENERATOR_KEY)
    if saved is not None:
        # the party's own generator from its previous round, rebuilt and its weights loaded
        # (its construction reseeds torch; the round's seed is set after this)
        gen = strategy._generator(shard.party)
        gen.load_state_dict(saved.to_torch_state_dict())
    return strategy


def _own_model(msg: Message, node: dict, s: dict, rnd: int) -> Message:
    """The node's trained model file (its own, trusted, still checked like any bundle)."""
    from mrtf.io.bundles import load_bundle

    bundle = load_bundle(str(node["model"]))
    meta = bundle.meta
    if meta.arch != s["arch"] or meta.num_classes != s["num_classes"]:
        raise InputError(f"{bundle.path.name}: a {meta.arch} model with {meta.num_classes} "
                         f"classes; the run wants {s['arch']} with {s['num_classes']}")
    if meta.label_counts is None:
        raise InputError(f"{bundle.path.name}: has no label counts (mrtf.label_counts)")
    n = meta.n_samples or sum(meta.label_counts)
    loss = meta.train_loss if meta.train_loss is not None else float("nan")
    content = RecordDict({"arrays": to_record(bundle.state_dict),
                          "metrics": metrics_record(n, meta.label_counts, loss, rnd)})
    return Message(content, reply_to=msg)


def _int(config: ConfigRecord, key: str) -> int:
    v = config.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InputError(f"the server's message: {key} must be an integer >= 0, got {v!r}")
    return v


def _int_list(config: ConfigRecord, key: str) -> list[int]:
    v = config.get(key)
    if not isinstance(v, list) or not 1 <= len(v) <= 4 or not all(
            isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= 4096 for i in v):
        raise InputError(f"the server's message: {key} must be a list of 1-4 sizes, got {v!r}")
    return v
