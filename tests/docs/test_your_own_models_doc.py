"""docs/your-own-models.md runs as written: its files are written to a folder, its shell block
runs there with the real ``mrtf`` command (three parties of a user-defined BatchNorm CNN from
a shared start, saved with ``torch.save(model.state_dict())`` + a sidecar, refined from the
folder that holds ``mynet.py``), and what it says about the result holds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from sklearn.datasets import load_digits

from mrtf.cli.main import cli
from mrtf.io.bundles import load_bundle

DOC = Path(__file__).resolve().parents[2] / "docs" / "your-own-models.md"
# a fenced block, with the HTML comment before it that marks it: <!-- file: NAME --> or
# <!-- run --> (invisible on GitHub and in the docs site)
BLOCK = re.compile(r"^(?:<!-- (file: \S+|run) -->\n)?```(\w+)\n(.*?)^```", re.S | re.M)


def blocks() -> list[tuple[str, str, str]]:
    """(language, its mark: 'file=NAME', 'run' or '', body) of every fenced block."""
    return [(m[2], (m[1] or "").replace("file: ", "file="), m[3])
            for m in BLOCK.finditer(DOC.read_text())]


def run_doc(folder: Path) -> subprocess.CompletedProcess:
    """Write the document's ``file=`` blocks into ``folder`` and run its ``run`` blocks there
    with bash, the test's Python and its ``mrtf`` first on PATH."""
    runs = []
    for lang, info, body in blocks():
        if info.startswith("file="):
            (folder / info.removeprefix("file=")).write_text(body)
        elif lang == "sh" and info == "run":
            runs.append(body)
    assert runs, "the document has no runnable shell block"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "2", "PYTHONPATH": ""}
    return subprocess.run(["bash", "-e", "-c", "\n".join(runs)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    folder = tmp_path_factory.mktemp("your-own-models")
    return folder, run_doc(folder)


def pilot_truth() -> np.ndarray:
    """The true labels of the example's 600 unlabeled digits (the test knows; mrtf not)."""
    _, y = load_digits(return_X_y=True)
    return y[np.random.default_rng(0).permutation(len(y))[:600]]


def load_party(folder: Path, name: str, monkeypatch):
    """A received file loaded in this process from ``folder`` (where mynet.py is), as mrtf
    does; ``mynet`` is not left behind in ``sys.modules`` for other tests."""
    monkeypatch.chdir(folder)
    monkeypatch.delitem(sys.modules, "mynet", raising=False)
    model = load_bundle(folder / name, trusted_archs=["mynet:make"])
    monkeypatch.delitem(sys.modules, "mynet", raising=False)
    return model


def test_the_example_runs_as_written(example, monkeypatch):
    folder, res = example
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert (folder / "refined.safetensors").is_file()
    with h5py.File(folder / "labels.h5") as f:
        labels = f["labels"][:]
        x = torch.from_numpy(h5py.File(folder / "target.h5")["x"][:])
    truth = pilot_truth()
    accuracy = float((labels == truth).mean())
    with torch.no_grad():
        alone = [float((load_party(folder, f"received/party{k}.pt", monkeypatch).build()(x)
                        .argmax(1).numpy() == truth).mean()) for k in range(3)]
    # the refined labels are better than the parties' own predictions, on average
    assert accuracy >= 0.9 and accuracy >= np.mean(alone), (accuracy, alone)


def test_no_party_of_the_clean_set_is_flagged(example, monkeypatch):
    folder, res = example
    assert res.returncode == 0, res.stderr[-2000:]
    monkeypatch.chdir(folder)
    monkeypatch.delitem(sys.modules, "mynet", raising=False)
    out = CliRunner().invoke(cli, ["inspect", "received", "--data", "target.h5",
                                   "--trust-arch", "mynet:make", "--json"])
    monkeypatch.delitem(sys.modules, "mynet", raising=False)
    assert out.exit_code == 0, out.output
    verdicts = [r["verdict"] for r in json.loads(out.stdout)["reliability"]]
    assert verdicts == ["trusted"] * 3


def test_the_sidecar_shown_is_the_one_written(example, monkeypatch):
    folder, res = example
    assert res.returncode == 0, res.stderr[-2000:]
    shown = [json.loads(body) for lang, _, body in blocks() if lang == "json"]
    minimal, party0 = shown[0], shown[1]
    written = json.loads((folder / "received" / "party0.json").read_text())
    assert set(written) == set(party0)
    assert written["mrtf.n_samples"] == sum(written["mrtf.label_counts"])
    # the minimal sidecar is enough to load a party's file
    (folder / "minimal").mkdir()
    (folder / "minimal" / "p.pt").write_bytes((folder / "received" / "party0.pt").read_bytes())
    (folder / "minimal" / "p.json").write_text(json.dumps(minimal))
    model = load_party(folder, "minimal/p.pt", monkeypatch)
    assert model.meta.num_classes == 10 and any("bn" in k for k in model.state_dict)
