"""Issue 15.1: labels map back to the user's files. `mrtf convert` of an image folder stores
each image's relative path as `ids`; every labels file carries them; `--csv` writes
id,label,confidence."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from mrtf.cli.main import cli
from mrtf.io import H5Dataset, read_dataset, read_labels


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _write_pngs(folder, x, names):
    folder.mkdir(parents=True, exist_ok=True)
    for img, name in zip(x, names):
        Image.fromarray((img[0] * 255).round().astype(np.uint8)).save(folder / name)


@pytest.fixture(scope="module")
def image_folders(digits_federation, tmp_path_factory):
    """A flat folder of 12 unlabeled 8×8 digit images and a class-folder copy of them."""
    _, target, _ = digits_federation
    x, y = read_dataset(target)
    root = tmp_path_factory.mktemp("imgs")
    names = [f"scan_{i:02d}.png" for i in range(12)]
    _write_pngs(root / "flat", x[:12], names)
    for img, lab, name in zip(x[:12], y[:12], names):
        _write_pngs(root / "classes" / f"digit{lab}", img[None], [name])
    return root, names


def test_flat_folder_ids_round_trip_to_labels_and_csv(digits_federation, image_folders):
    received, _, _ = digits_federation
    root, names = image_folders
    assert run("convert", root / "flat", root / "flat.h5", "-q").exit_code == 0
    with H5Dataset(root / "flat.h5") as ds:
        assert ds.ids().tolist() == sorted(names) and not ds.has_labels
    res = run("refine", received, "--data", root / "flat.h5", "--method", "fedavg",
              "--labels", root / "l.h5", "--csv", root / "l.csv", "--model", root / "m.safetensors",
              "--steps", "1", "-q")
    assert res.exit_code == 0, res.output
    labels = read_labels(root / "l.h5")
    assert labels.ids.tolist() == sorted(names)
    with open(root / "l.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["id", "label", "confidence"]
    assert [r[0] for r in rows[1:]] == sorted(names)
    assert [int(r[1]) for r in rows[1:]] == labels.labels.tolist()
    np.testing.assert_allclose([float(r[2]) for r in rows[1:]], labels.confidence, atol=1e-6)
    # `mrtf label` carries the ids too, to the .h5 and to the CSV
    res = run("label", root / "m.safetensors", "--data", root / "flat.h5", "--labels",
              root / "l2.h5", "--csv", root / "l2.csv", "-q")
    assert res.exit_code == 0, res.output
    assert read_labels(root / "l2.h5").ids.tolist() == sorted(names)
    assert (root / "l2.csv").read_text().splitlines()[1].startswith("scan_00.png,")


def test_class_folders_store_relative_paths(image_folders):
    root, _ = image_folders
    assert run("convert", root / "classes", root / "c.h5", "-q").exit_code == 0
    with H5Dataset(root / "c.h5") as ds:
        ids = ds.ids().tolist()
        y = ds.labels()
    assert all(i.startswith("digit") and "/scan_" in i for i in ids)
    classes = sorted({i.split("/")[0] for i in ids})
    assert [classes[k] for k in y] == [i.split("/")[0] for i in ids]


def test_label_csv_only_and_rows_without_ids(digits_federation, tmp_path):
    received, target, _ = digits_federation
    model = next(received.glob("client-*.safetensors"))
    res = run("label", model, "--data", target, "--csv", tmp_path / "l.csv", "-q")
    assert res.exit_code == 0, res.output
    lines = (tmp_path / "l.csv").read_text().splitlines()
    assert lines[1].startswith("0,") and len(lines) == 301
    res = run("label", model, "--data", target)
    assert res.exit_code == 2 and "--labels" in res.output
