"""mrtf.trust.basin: parties from different starts (issue 33 item 3), with real training.

Four LeNet parties train on sklearn digits (Dirichlet 5.0 shards, 5 epochs), once from one
shared start and once each from its own random start. No clean party may be flagged in either;
from independent starts there is no parameter average and the labels are at least the
ensemble's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from mrtf.cli.main import cli
from mrtf.federated import local_train
from mrtf.federated.runner import RunConfig, prepare_run
from mrtf.io.bundles import BundleMeta, ReceivedModel, ReceivedSet, save_bundle
from mrtf.io.hdf5 import ArraySource, write_dataset
from mrtf.models import build_model
from mrtf.refinery import RefineConfig, accuracy_of, refine
from mrtf.refinery.assess import assess_received
from mrtf.refinery.pipeline import PlanWatch, preview
from mrtf.trust.basin import SHARED_COSINE, assess_basin, start_line, weight_cosine

PARTIES = 4


def _parties(shared: bool) -> tuple[ReceivedSet, ArraySource, np.ndarray]:
    cfg = RunConfig(dataset="digits", clients=PARTIES, split="dirichlet:5.0", ratio=1.0,
                    rounds=1, arch="lenet", target_size=300, seeds=[0], epochs=5,
                    batch_size=16, lr=0.05)
    fed = prepare_run(cfg, 0)

    def start(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return build_model("lenet", fed.num_classes, **fed.arch_kwargs)

    models = []
    for k in range(PARTIES):
        idx = torch.from_numpy(fed.parts[k])
        res = local_train(start(0 if shared else 100 + k), fed.x[idx], fed.y[idx],
                          fed.num_classes, cfg.local_config(), seed=k)
        meta = BundleMeta(arch="lenet", num_classes=fed.num_classes,
                          arch_kwargs=fed.arch_kwargs, party=f"p{k}", n_samples=len(idx),
                          train_loss=res.train_loss, round=0)
        models.append(ReceivedModel(Path(f"p{k}.safetensors"), meta, res.model.state_dict()))
    if shared:
        meta = BundleMeta(arch="lenet", num_classes=fed.num_classes,
                          arch_kwargs=fed.arch_kwargs, party="server", round=0, role="global")
        models.append(ReceivedModel(Path("global.safetensors"), meta, start(0).state_dict()))
    return ReceivedSet(models, []), ArraySource(fed.target_x.numpy()), fed.target_y.numpy()


@pytest.fixture(scope="module")
def shared():
    return _parties(True)


@pytest.fixture(scope="module")
def independent():
    return _parties(False)


def _ensemble_accuracy(rs: ReceivedSet, src: ArraySource, y: np.ndarray) -> float:
    x = torch.from_numpy(src.read(0, len(src)))
    with torch.inference_mode():
        probs = torch.stack([m.build()(x).softmax(1) for m in rs.by_role("local")]).mean(0)
    return float((probs.argmax(1).numpy() == y).mean())


def test_weights_tell_the_starts_apart(shared, independent):
    cos_shared = weight_cosine([m.state_dict for m in shared[0].by_role("local")])
    cos_indep = weight_cosine([m.state_dict for m in independent[0].by_role("local")])
    assert cos_shared >= SHARED_COSINE > cos_indep
    # what refine says before any work (from the weights alone)
    assert start_line(shared[0]) is None
    assert start_line(independent[0]).startswith("parties trained from their own starts")


def test_basin_from_behaviour():
    """An average agreeing with the ensemble by chance is said (weak), one that agrees is not;
    the average is dropped only when the weights say the starts differ."""
    logits = np.random.default_rng(0).normal(size=(3, 200, 10))
    ens = logits.mean(0)
    assert not assess_basin(0.9, logits, ens).weak_average
    weak = assess_basin(0.9, logits, np.roll(ens, 1, axis=1))
    assert weak.weak_average and weak.average_works and "far from it" in weak.line()
    assert not assess_basin(0.01, logits, ens).average_works


class Watched(PlanWatch):
    def __init__(self) -> None:
        self.plan, self.choice = None, None

    def planned(self, preview) -> None:
        self.plan = preview

    def chosen(self, line: str) -> None:
        self.choice = line


def test_independent_parties_are_not_attackers_and_not_averaged(independent):
    rs, src, y = independent
    watched = Watched()
    res = refine(rs, src, RefineConfig(seed=0, progress=False), watch=watched)
    # said before the data pass: no average, the student starts as the best party, no one
    # flagged; and preview() (inspect --data) gives the same plan without refining
    assert not watched.plan.average and "starts as party" in watched.plan.start
    assert watched.plan.basin == res.parties.basin.line and watched.plan.flagged == []
    assert preview(rs, src, RefineConfig(seed=0, progress=False)) == \
        (watched.plan, watched.choice)
    basin = res.parties.basin
    assert not basin.shared_start and not basin.average_used
    assert res.notes[0].startswith("parties trained from their own starts")
    assert "no parameter average" in res.notes[0] and basin.line == res.notes[0]
    assert all(p.verdict == "trusted" for p in res.parties.parties)
    assert accuracy_of(res.probs, y) >= _ensemble_accuracy(rs, src, y)
    # inspect --data says the same, and flags no one
    report = assess_received(rs, src)
    assert report.flagged == [] and "no parameter average" in report.notes[0]


def test_cli_names_the_start_of_independent_parties(independent, tmp_path):
    """``refine``'s scores name what distillation started from: the best party (no parameter
    average was formed), not "averaged model"."""
    rs, src, y = independent
    for m in rs.models:
        save_bundle(tmp_path / "received" / f"{m.meta.party}.safetensors", m.state_dict,
                    m.meta)
    write_dataset(tmp_path / "target.h5", src.read(0, len(src)), y)
    res = CliRunner().invoke(cli, ["refine", str(tmp_path / "received"), "--data",
                                   str(tmp_path / "target.h5"), "--labels",
                                   str(tmp_path / "l.h5"), "--steps", "5"])
    assert res.exit_code == 0, res.output
    rows = [ln.split("  ")[0] for ln in res.stdout.splitlines()]
    assert "student before refinement" in rows and "averaged model" not in rows


def test_shared_start_is_averaged_and_nobody_flagged(shared):
    rs, src, _ = shared
    res = refine(rs, src, RefineConfig(seed=0, progress=False))
    basin = res.parties.basin
    assert basin.shared_start and basin.average_used
    assert all(p.verdict == "trusted" for p in res.parties.parties)
    assert res.notes[0].startswith("parties share a basin")


def test_batchnorm_and_weight_norm_vectors_do_not_make_independent_starts_alike():
    """BatchNorm's γ (all 1 at any seed) and weight norm's g made four independent
    lenet_shot starts look like one (flattened with them: cosine ~0.38 > SHARED_COSINE); the
    basin reads the weight matrices and kernels only."""
    from mrtf.models import build_model
    from mrtf.trust.basin import matrix_weights
    from mrtf.trust.selection import flat_weights

    states = []
    for seed in range(4):
        torch.manual_seed(seed)
        states.append(build_model("lenet_shot", num_classes=10).state_dict())
    flat = torch.nn.functional.normalize(torch.stack([flat_weights(s) for s in states]), dim=1)
    with_vectors = float(np.median((flat @ flat.T).numpy()[np.triu_indices(4, 1)]))
    assert with_vectors > SHARED_COSINE  # what the rule used to read
    assert abs(weight_cosine(states)) < 0.05
    kept = matrix_weights(states[0])
    assert "classifier.weight_g" not in kept and "bottleneck.1.weight" not in kept
    assert "bottleneck.0.weight" in kept and all(v.dim() >= 2 for v in kept.values())
