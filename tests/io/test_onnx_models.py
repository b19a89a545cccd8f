"""Received ONNX models (mrtf/io/onnx_files.py): hostile graphs refused with one line before
a session exists; a PyTorch party exported to ONNX and scikit-learn MLPClassifier parties
refined end to end; the ONNX and PyTorch versions of the same weights give the same labels."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx_builders import HOSTILE, linear_graph, save  # noqa: E402

from mrtf.cli.main import cli  # noqa: E402
from mrtf.io.bundles import load_bundle, load_received  # noqa: E402


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_a_valid_graph_teaches_its_logits(tmp_path):
    received = load_bundle(save(tmp_path / "p.onnx", linear_graph()))
    assert received.meta.arch == "onnx" and received.meta.num_classes == 3
    assert received.state_dict == {}  # it only teaches: nothing to average or train
    x = torch.rand(5, 4)
    w = torch.arange(12, dtype=torch.float32).reshape(4, 3) / 10
    torch.testing.assert_close(received.build()(x), x @ w)


def test_metadata_from_a_sidecar_and_probabilities_as_log(tmp_path):
    from onnx import helper

    graph = linear_graph([helper.make_node("Softmax", ["logits"], ["probabilities"])])
    graph.output[0].name = "probabilities"
    save(tmp_path / "p.onnx", graph, meta=None)
    (tmp_path / "p.json").write_text(json.dumps({"mrtf.num_classes": 3, "mrtf.party": "s"}))
    received = load_received(tmp_path)  # the sidecar is read with its model, not skipped
    (m,) = received.models
    assert m.name == "s"
    x = torch.rand(5, 4)
    w = torch.arange(12, dtype=torch.float32).reshape(4, 3) / 10
    torch.testing.assert_close(m.build()(x), torch.log_softmax(x @ w, 1))


def test_a_features_output_gives_the_teacher_features(tmp_path):
    from onnx import TensorProto, helper

    graph = linear_graph([helper.make_node("Relu", ["x"], ["features"])])
    graph.output.append(helper.make_tensor_value_info("features", TensorProto.FLOAT, ["n", 4]))
    teacher = load_bundle(save(tmp_path / "p.onnx", graph)).build()
    x = torch.randn(3, 4)
    h, logits = teacher.forward_features(x)
    torch.testing.assert_close(h, torch.relu(x))
    torch.testing.assert_close(logits, teacher(x))
    plain = load_bundle(save(tmp_path / "q.onnx", linear_graph())).build()
    assert not hasattr(plain, "forward_features")  # then the student's features are used


@pytest.mark.parametrize("case", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_graphs_get_one_line_and_exit_2(case, tmp_path):
    _, build, says = case
    path = build(tmp_path / "evil.onnx")
    res = run("inspect", path)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mrtf: error: "), res.stderr
    assert says in lines[0] and "Traceback" not in res.output


def test_a_hostile_graph_stops_refine_before_the_work(tmp_path):
    (tmp_path / "recv").mkdir()
    HOSTILE[0][1](tmp_path / "recv" / "evil.onnx")
    with h5py.File(tmp_path / "t.h5", "w") as f:
        f["x"] = np.zeros((4, 4), np.float32)
    res = run("refine", tmp_path / "recv", "--data", tmp_path / "t.h5", "--labels",
              tmp_path / "l.h5")
    assert res.exit_code == 2 and "declares 10,000,000,000 values" in res.stderr
    assert not (tmp_path / "l.h5").exists()


def export_party(bundle_path: Path, out: Path) -> Path:
    """A PyTorch party exported to ONNX as docs/your-own-models.md shows, its metadata in
    metadata_props."""
    import onnx

    pytest.importorskip("onnxscript")  # what torch.onnx.export (dynamo) needs
    party = load_bundle(bundle_path)
    model = party.build()
    torch.onnx.export(model, (torch.rand(2, 1, 8, 8),), str(out), input_names=["x"],
                      output_names=["logits"],
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    graph = onnx.load(str(out))
    for key, value in party.meta.to_header().items():
        if key not in ("mrtf.arch", "mrtf.arch_kwargs"):
            graph.metadata_props.add(key=key, value=value)
    onnx.save(graph, str(out))
    return out


def test_pytorch_party_as_onnx_refines_and_labels_the_same(digits_oneshot, tmp_path):
    received, target = digits_oneshot
    files = sorted(received.glob("*.safetensors"))
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for f in files[1:]:
        shutil.copy(f, mixed / f.name)
    onnx_file = export_party(files[0], mixed / f"{files[0].stem}.onnx")
    # the same weights as ONNX and as PyTorch: the same outputs, the same labels
    x = torch.from_numpy(h5py.File(target)["x"][:])
    torch.testing.assert_close(load_bundle(onnx_file).build()(x),
                               load_bundle(files[0]).build()(x), rtol=1e-4, atol=1e-4)
    for name, model in (("pt", files[0]), ("onnx", onnx_file)):
        res = run("label", model, "--data", target, "--labels", tmp_path / f"{name}.h5")
        assert res.exit_code == 0, res.output
    same = [h5py.File(tmp_path / f"{n}.h5")["labels"][:] for n in ("pt", "onnx")]
    np.testing.assert_array_equal(same[0], same[1])
    res = run("refine", mixed, "--data", target, "--labels", tmp_path / "l.h5", "--steps",
              100, "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["heterogeneous"] and summary["accuracy"]["refined"] >= 0.85, summary
    assert all(r["verdict"] == "trusted" for r in summary["reliability"])


def test_sklearn_parties_refine_into_a_student(tmp_path):
    pytest.importorskip("skl2onnx")
    from skl2onnx import to_onnx
    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier

    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    (tmp_path / "recv").mkdir()
    alone = []
    for k, rows in enumerate(np.array_split(order[600:], 3)):
        clf = MLPClassifier((32,), max_iter=300, random_state=k).fit(x[rows], y[rows])
        alone.append(clf.score(x[order[:600]], y[order[:600]]))
        onx = to_onnx(clf, x[:1])  # the default export: probabilities as a ZipMap
        (tmp_path / "recv" / f"sk{k}.onnx").write_bytes(onx.SerializeToString())
        (tmp_path / "recv" / f"sk{k}.json").write_text(
            json.dumps({"mrtf.num_classes": 10, "mrtf.n_samples": len(rows)}))
    with h5py.File(tmp_path / "t.h5", "w") as f:
        f["x"], f["y"] = x[order[:600]], y[order[:600]]
    res = run("refine", tmp_path / "recv", "--data", tmp_path / "t.h5", "--labels",
              tmp_path / "l.h5", "--student-arch", "mlp", "--steps", 200, "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    # the labels (neighbour vote of the refined student) match the parties' mean accuracy
    assert summary["accuracy"]["refined"] >= np.mean(alone) - 0.02, (summary["accuracy"], alone)


def test_onnx_only_sets_say_what_is_missing(tmp_path):
    (tmp_path / "recv").mkdir()
    save(tmp_path / "recv" / "a.onnx", linear_graph())
    with h5py.File(tmp_path / "t.h5", "w") as f:
        f["x"] = np.random.default_rng(0).random((16, 4), dtype=np.float32)
    res = run("refine", tmp_path / "recv", "--data", tmp_path / "t.h5", "--labels",
              tmp_path / "l.h5")
    assert res.exit_code == 2 and "--student-arch" in res.stderr, res.output
    res = run("refine", tmp_path / "recv", "--model", tmp_path / "m.safetensors")
    assert res.exit_code == 2 and "refine with --data" in res.stderr, res.output
    res = run("refine", tmp_path / "recv", "--data", tmp_path / "t.h5", "--labels",
              tmp_path / "l.h5", "--student-arch", "mlp", "--steps", 5)
    assert res.exit_code == 0, res.output
    assert not any(tmp_path.glob("*.tmp*")) and (tmp_path / "l.h5").is_file()


def test_without_the_extra_an_onnx_file_says_what_to_install(tmp_path, monkeypatch):
    import mrtf.io.onnx_bounds as bounds

    path = save(tmp_path / "p.onnx", linear_graph())

    def missing(name):
        raise ImportError(name)

    monkeypatch.setattr(bounds.importlib, "import_module", missing)
    res = run("inspect", path)
    assert res.exit_code == 2 and "pip install 'mrtf[onnx]'" in res.stderr, res.output


def test_onnx_parties_are_not_copies_of_each_other(tmp_path):
    """An ONNX graph has no state dict: distinct graphs all teach, a byte-identical file under
    a second name counts once (mrtf.trust.selection)."""
    from mrtf.io.bundles import load_received
    from mrtf.trust.selection import select

    recv = tmp_path / "recv"
    recv.mkdir()
    for k in range(3):
        save(recv / f"p{k}.onnx", linear_graph(), meta_of(k))
    chosen = select(load_received(recv))
    assert len(chosen.locals_) == 3 and not chosen.copies
    shutil.copy(recv / "p0.onnx", recv / "p0-again.onnx")
    chosen = select(load_received(recv))
    assert len(chosen.locals_) == 3 and len(chosen.copies) == 1


def meta_of(k: int) -> dict:
    return {"mrtf.num_classes": "3", "mrtf.party": f"party{k}"}
