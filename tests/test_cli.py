"""End-to-end tests of the real `mrtf` command on real (small) data: scikit-learn digits."""

from __future__ import annotations

import json
import subprocess
import sys

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from mrtf.cli.main import cli


def run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


SIM = ["simulate", "--dataset", "digits", "--clients", "6", "--split", "label:2", "--ratio",
       "0.5", "--rounds", "2", "--epochs", "1", "--arch", "lenet", "--target-size", "200",
       "--seed", "0"]


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    res = run(*SIM, "--export-received", root / "received", "--export-target",
              root / "target.h5", "--json")
    assert res.exit_code == 0, res.output
    return root, json.loads(res.output)


def test_simulate_prints_rounds_and_exports(simulated):
    root, summary = simulated
    assert len(summary["rounds"]) == 2
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in summary["rounds"])
    files = sorted(p.name for p in (root / "received").iterdir())
    assert len(files) == 4 and "global-start.safetensors" in files  # 3 clients + θ_t
    with h5py.File(root / "target.h5") as f:
        assert f["x"].shape == (200, 1, 8, 8) and f["y"].shape == (200,)


def test_simulate_is_deterministic(simulated, tmp_path):
    _, summary = simulated
    again = json.loads(run(*SIM, "--json").output)
    assert [r["accuracy"] for r in again["rounds"]] == [r["accuracy"] for r in
                                                        summary["rounds"]]


def test_inspect_directory_model_and_h5(simulated):
    root, _ = simulated
    res = run("inspect", root / "received")
    assert res.exit_code == 0 and "4 valid, 0 refused" in res.output
    data = json.loads(run("inspect", root / "received", "--json").output)
    local = [m for m in data["models"] if m["role"] == "local"]
    assert len(local) == 3
    assert all(sum(m["label_counts"]) == m["samples"] for m in local)
    assert all(sum(c > 0 for c in m["label_counts"]) == 2 for m in local)  # label:2
    one = json.loads(run("inspect", root / "received" / "global-start.safetensors",
                         "--json").output)
    assert one["role"] == "global" and one["arch"] == "lenet"
    h5 = json.loads(run("inspect", root / "target.h5", "--json").output)
    assert h5["datasets"]["x"]["shape"] == [200, 1, 8, 8]


def test_inspect_shows_refused_file(simulated, tmp_path):
    root, _ = simulated
    bad = tmp_path / "recv"
    bad.mkdir()
    for p in (root / "received").iterdir():
        (bad / p.name).write_bytes(p.read_bytes())
    (bad / "zz-broken.safetensors").write_bytes(b"garbage")
    res = run("inspect", bad)
    assert res.exit_code == 0
    assert "refused: corrupt or truncated" in res.output and "4 valid, 1 refused" in res.output


@pytest.mark.parametrize("args,message", [
    (["simulate", "--dataset", "nope"], "unknown dataset"),
    (["simulate", "--dataset", "digits", "--split", "dirichlet:-1"], "bad split"),
    (["simulate", "--dataset", "digits", "--arch", "alexnet"], "unknown architecture"),
    (["simulate", "--dataset", "digits", "--clients", "4", "--ratio", "0.1"], "R·K < 1"),
    (["inspect", "missing-dir"], "no such file"),
    (["refine", "missing-dir", "--model", "m.safetensors"], "no such directory"),
])
def test_bad_input_exit_2_one_line(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2
    assert message in res.output
    assert "Traceback" not in res.output
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_simulate_refuses_existing_outputs(simulated, tmp_path):
    root, _ = simulated
    before = sorted(p.name for p in (root / "received").iterdir())
    res = CliRunner().invoke(cli, [*SIM, "--export-received", str(root / "received")])
    assert res.exit_code == 2 and "--force" in res.output
    assert sorted(p.name for p in (root / "received").iterdir()) == before


def test_refine_teachers_in_bf16(simulated, tmp_path):
    """--precision bf16: the run notes the teachers' agreement with fp32, the labels stay
    close to an fp32 run's; a precision it does not know is one line, exit code 2."""
    root, _ = simulated
    out = {}
    for precision in ("fp32", "bf16"):
        labels = tmp_path / f"{precision}.h5"
        res = run("refine", root / "received", "--data", root / "target.h5", "--labels",
                  labels, "--steps", "20", "--precision", precision, "--json")
        assert res.exit_code == 0, res.output
        out[precision] = json.loads(res.output)
        with h5py.File(labels) as f:
            out[precision]["labels"] = f["labels"][:]
            out[precision]["config"] = json.loads(f.attrs["config"])
    notes = [n for n in out["bf16"]["notes"] if n.startswith("teachers in bf16")]
    assert len(notes) == 1 and "on the first 200 samples" in notes[0]
    assert not any("bf16" in n for n in out["fp32"]["notes"])
    assert out["bf16"]["config"]["precision"] == "bf16"
    assert (out["bf16"]["labels"] == out["fp32"]["labels"]).mean() >= 0.9
    res = CliRunner().invoke(cli, ["refine", str(root / "received"), "--data",
                                   str(root / "target.h5"), "--precision", "fp16"])
    assert res.exit_code == 2 and "fp16" in res.output


def test_console_script_runs_as_a_process(tmp_path):
    """The installed entry point, in a real process: errors are one line, exit code 2."""
    proc = subprocess.run([sys.executable, "-m", "mrtf.cli.main", "simulate", "--split",
                           "label:0"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "bad split" in proc.stderr


def test_refine_label_score_end_to_end(simulated, tmp_path):
    root, _ = simulated
    labels, model = tmp_path / "labels.h5", tmp_path / "refined.safetensors"
    res = run("refine", root / "received", "--data", root / "target.h5", "--labels", labels,
              "--model", model, "--steps", "30", "--seed", "1", "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["method"] == "adaptive" and set(summary["accuracy"]) == {
        "averaged", "targets", "refined_model", "refined"}  # refined: the labels' (voted)
    assert summary["neighbour_vote"]["k"] == 3 and summary["neighbour_vote"]["changed"] >= 0
    assert summary["novelty"]["line"].startswith("target novelty")  # vote or adapt, and why
    assert isinstance(summary["novelty"]["adapt"], bool)
    # the default class prior ("auto") says which prior it kept and the evidence for it
    assert summary["class_prior"]["chosen"] in ("learned", "uniform")
    assert set(summary["class_prior"]["agreement"]) == {"learned", "uniform"}
    with h5py.File(labels) as f:
        assert f["labels"].shape == (200,) and f["probs"].shape == (200, 10)
        np.testing.assert_allclose(f["probs"][:].sum(1), 1.0, rtol=1e-5)
        assert f.attrs["method"] == "adaptive" and "config" in f.attrs
    scored = json.loads(run("score", labels, "--truth", root / "target.h5", "--json").output)
    assert scored["accuracy"] == pytest.approx(summary["accuracy"]["refined"])
    assert np.array(scored["confusion"]).sum() == 200
    # The refined model file can be received again and labels the same data identically.
    relabeled = tmp_path / "again.h5"
    assert run("label", model, "--data", root / "target.h5", "--labels",
               relabeled).exit_code == 0
    with h5py.File(labels) as a, h5py.File(relabeled) as b:
        assert np.array_equal(a["labels"][:], b["labels"][:])
    # Same seed → identical labels.
    again = tmp_path / "labels2.h5"
    run("refine", root / "received", "--data", root / "target.h5", "--labels", again,
        "--steps", "30", "--seed", "1", "--quiet")
    with h5py.File(labels) as a, h5py.File(again) as b:
        assert np.array_equal(a["probs"][:], b["probs"][:])


@pytest.mark.parametrize("extra,message", [
    (["--labels", "{tmp}/l.h5"], "--labels needs --data"),
    (["--data", "{root}/target.h5"], "nothing to write"),
    (["--data", "{root}/target.h5", "--labels", "{root}/target.h5"], "overwrite an input"),
    (["--data", "{root}/target.h5", "--labels", "{tmp}/wrong.h5"], "pass --force"),
    (["--data", "{tmp}/missing.h5", "--labels", "{tmp}/l.h5"], "no such file"),
    (["--data", "{tmp}/wrong.h5", "--labels", "{tmp}/l.h5"], "do not fit"),
    (["--data", "{tmp}/empty.h5", "--labels", "{tmp}/l.h5"], "empty"),
    (["--data", "{root}/target.h5", "--labels", "{tmp}/l.h5", "--student",
      "{tmp}/five.safetensors"], "classes"),
    (["--data", "{root}/target.h5", "--labels", "{tmp}/l.h5", "--method", "mrtf",
      "--class-prior", "uniform"], "applies to the adaptive method only"),
    (["--data", "{root}/target.h5", "--labels", "{tmp}/l.h5", "--class-frequencies", "1,2"],
     "2 class frequencies were given but the received models have 10 classes"),
    (["--data", "{root}/target.h5", "--labels", "{tmp}/l.h5", "--class-frequencies", "x,y"],
     "comma-separated numbers"),
    (["--data", "{root}/target.h5", "--labels", "{tmp}/l.h5", "--class-frequencies",
      "1,-1,1,1,1,1,1,1,1,1"], "non-negative"),
    (["--model", "{tmp}/m.safetensors", "--class-frequencies", "1,1,1,1,1,1,1,1,1,1"],
     "apply with --data only"),
    (["--data", "{root}/target.h5", "--labels", "{tmp}/l.h5", "--class-frequencies",
      "1,1,1,1,1,1,1,1,1,1", "--class-prior", "uniform"], "leave --class-prior at auto"),
])
def test_refine_bad_input(simulated, tmp_path, extra, message):
    root, _ = simulated
    from mrtf.io import BundleMeta, save_bundle, write_dataset
    from mrtf.models import build_model

    write_dataset(tmp_path / "wrong.h5", np.zeros((5, 3, 28, 28), np.float32))
    with h5py.File(tmp_path / "empty.h5", "w") as f:
        f["x"] = np.zeros((0, 1, 8, 8), np.float32)
    kw = {"in_channels": 1, "image_size": 8}
    save_bundle(tmp_path / "five.safetensors", build_model("lenet", 5, **kw),
                BundleMeta(arch="lenet", num_classes=5, arch_kwargs=kw))
    before = sorted(p.name for p in tmp_path.iterdir())
    args = [a.format(tmp=tmp_path, root=root) for a in extra]
    res = CliRunner().invoke(cli, ["refine", str(root / "received"), *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_refine_without_data_fuses_data_free(simulated, tmp_path):
    root, _ = simulated
    model, png = tmp_path / "fused.safetensors", tmp_path / "samples.png"
    res = run("refine", root / "received", "--model", model, "--steps", "10",
              "--dump-samples", png, "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["datafree"] == "fedftg" and "label counts" in summary["reason"]
    assert model.exists() and png.read_bytes()[:4] == b"\x89PNG"
    # The fused model is a normal bundle: `mrtf label` uses it for data collected later.
    assert run("label", model, "--data", root / "target.h5", "--labels",
               tmp_path / "l.h5").exit_code == 0
    res = run("refine", root / "received", "--model", tmp_path / "kf.safetensors",
              "--datafree", "fedkf", "--steps", "5", "--quiet")
    assert res.exit_code == 0 and (tmp_path / "kf.safetensors").exists()
    # one round of parties: FedKF can only return the average; said before any work
    res = run("refine", root / "received", "--model", tmp_path / "kf2.safetensors",
              "--datafree", "fedkf", "--dump-samples", tmp_path / "kf.png")
    assert res.exit_code == 2 and "fedkf would train nothing here" in res.output
    assert not (tmp_path / "kf2.safetensors").exists()


def test_forced_fedftg_without_counts_is_refused(simulated, tmp_path):
    root, _ = simulated
    from mrtf.io import load_bundle, save_bundle

    recv = tmp_path / "recv"
    recv.mkdir()
    for p in (root / "received").iterdir():
        m = load_bundle(p)
        m.meta.label_counts = None
        save_bundle(recv / p.name, m.state_dict, m.meta)
    res = CliRunner().invoke(cli, ["refine", str(recv), "--model", str(tmp_path / "m.st"),
                                   "--datafree", "fedftg"])
    assert res.exit_code == 2 and "use --datafree fedkf" in res.output
    assert not (tmp_path / "m.st").exists()


def test_heterogeneous_parties_need_and_use_a_student(simulated, tmp_path):
    root, _ = simulated
    import torch

    from mrtf.io import BundleMeta, save_bundle
    from mrtf.models import build_model

    recv = tmp_path / "recv"
    recv.mkdir()
    for p in (root / "received").iterdir():
        (recv / p.name).write_bytes(p.read_bytes())
    kw = {"in_channels": 1, "image_size": 8}
    torch.manual_seed(0)
    save_bundle(recv / "mlp-party.safetensors", build_model("mlp", 10, **kw),
                BundleMeta(arch="mlp", num_classes=10, arch_kwargs=kw, party="mlp-party",
                           train_loss=1.0, round=1, label_counts=[5] * 10, n_samples=50))
    args = ["refine", str(recv), "--data", str(root / "target.h5"), "--labels",
            str(tmp_path / "l.h5"), "--steps", "5"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and "differ in architecture" in res.output
    res = CliRunner().invoke(cli, [*args, "--student-arch", "convnet", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["heterogeneous"] is True
    assert any("heterogeneous" in n for n in summary["notes"])
    # issue 15.11: the student's accuracy is reported as the student's, not as an average
    assert set(summary["accuracy"]) == {"student", "targets", "refined_model", "refined"}


def test_convert_builtin_and_arrays(tmp_path):
    res = run("convert", "digits", tmp_path / "d.h5", "--image-size", "28", "--unlabeled",
              "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["shape"] == [1, 28, 28]
    with h5py.File(tmp_path / "d.h5") as f:
        assert f["x"].shape == (1797, 1, 28, 28) and "y" not in f
    np.savez(tmp_path / "a.npz", x=np.zeros((4, 8, 8), np.uint8), y=np.arange(4))
    assert run("convert", tmp_path / "a.npz", tmp_path / "a.h5").exit_code == 0
    with h5py.File(tmp_path / "a.h5") as f:
        assert f["x"].shape == (4, 1, 8, 8) and f["y"][:].tolist() == [0, 1, 2, 3]
    res = CliRunner().invoke(cli, ["convert", "nothing-here", str(tmp_path / "n.h5")])
    assert res.exit_code == 2 and "no such file" in res.output
    assert not (tmp_path / "n.h5").exists()
