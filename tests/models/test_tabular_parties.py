"""Non-image data end to end: three MLP parties on a real tabular set (scikit-learn's breast
cancer, 30 features), the pilot's features given as .npy, converted and refined; the
image-only input jitter switches off with a note; calibration and estimate still given."""

from __future__ import annotations

import json

import numpy as np
import torch
from click.testing import CliRunner
from sklearn.datasets import load_breast_cancer

from mrtf.cli.main import cli
from mrtf.io.bundles import BundleMeta, save_bundle
from mrtf.models import build_model

KW = {"in_features": 30, "hidden": 64, "feature_dim": 32}


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def train_parties(folder, x, y, rows_of_parties) -> list[torch.nn.Module]:
    """Each party trains the built-in mlp on its rows from a shared start, and sends a
    .safetensors bundle."""
    torch.manual_seed(0)
    start = build_model("mlp", 2, **KW).state_dict()
    models = []
    for k, rows in enumerate(rows_of_parties):
        model = build_model("mlp", 2, **KW)
        model.load_state_dict(start)
        opt = torch.optim.Adam(model.parameters(), 1e-3)
        xs, ys = torch.from_numpy(x[rows]), torch.from_numpy(y[rows])
        gen = torch.Generator().manual_seed(k)
        for _ in range(10):
            for b in torch.randperm(len(rows), generator=gen).split(32):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(xs[b]), ys[b]).backward()
                opt.step()
        save_bundle(folder / f"p{k}.safetensors", model,
                    BundleMeta("mlp", 2, KW, party=f"p{k}", n_samples=len(rows)))
        models.append(model.eval())
    return models


def test_tabular_mlp_parties_refine_from_npy(tmp_path):
    x, y = load_breast_cancer(return_X_y=True)
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    target = order[:200]
    (tmp_path / "recv").mkdir()
    models = train_parties(tmp_path / "recv", x, y, np.array_split(order[200:], 3))
    with torch.no_grad():
        alone = [float((m(torch.from_numpy(x[target])).argmax(1).numpy() == y[target]).mean())
                 for m in models]
    np.save(tmp_path / "x.npy", x[target])
    np.save(tmp_path / "y.npy", y[target])
    res = run("convert", tmp_path / "x.npy", tmp_path / "t.h5", "--labels", tmp_path / "y.npy")
    assert res.exit_code == 0, res.output
    res = run("refine", tmp_path / "recv", "--data", tmp_path / "t.h5", "--labels",
              tmp_path / "l.h5", "--model", tmp_path / "m.safetensors", "--steps", 20)
    assert res.exit_code == 0, res.output
    assert "input jitter is for images; off for samples of shape (30,)" in res.stdout
    res = run("refine", tmp_path / "recv", "--data", tmp_path / "t.h5", "--labels",
              tmp_path / "l.h5", "--steps", 100, "--json", "--force")
    summary = json.loads(res.stdout)
    assert summary["accuracy"]["refined"] >= np.mean(alone) - 0.02, (summary["accuracy"], alone)
    assert 0 < summary["estimated_accuracy"]["refined"] <= 1
    assert all(r["verdict"] == "trusted" for r in summary["reliability"])
    # a fresh built-in student for feature vectors gets in_features from the data
    res = run("refine", tmp_path / "recv", "--data", tmp_path / "t.h5", "--labels",
              tmp_path / "l2.h5", "--student-arch", "mlp", "--steps", 50)
    assert res.exit_code == 0, res.output
