"""Hostile inputs (issue 11): each is refused with one line on stderr and exit code 2, no
traceback, and nothing written (no output, no temporary or lock file), or accepted with a
warning and a documented conversion.

Every hostile file is built on the fly and is small (the largest, the zip bomb, is ~2 MB on
disk). Cases whose old failure was memory exhaustion run together in one subprocess whose
address space is capped with ``resource.setrlimit(RLIMIT_AS)`` (2 GiB; importing torch, faiss
and h5py needs ~1.5 GiB of address space), so a regression fails the test instead of the
machine. The others run in-process through click's CliRunner.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from mrtf.cli.main import cli
from mrtf.io import LabelSet, write_dataset, write_labels
from mrtf.models import build_model

KW = {"in_channels": 1, "image_size": 8}
HEAD = {"mrtf.arch": "lenet", "mrtf.num_classes": "10", "mrtf.arch_kwargs": json.dumps(KW),
        "mrtf.role": "local", "mrtf.label_counts": json.dumps([5] * 10),
        "mrtf.n_samples": "50", "mrtf.train_loss": "1.0", "mrtf.round": "1"}
M = 64  # target samples
AS_LIMIT = 2 << 30  # address-space cap of the memory cases' subprocess


# ------------------------------------------------------------------ shared valid inputs


def lenet_state(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return build_model("lenet", 10, **KW).state_dict()


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """Two valid LeNet parties, a target set (x, y, ids) and a labels file for it."""
    root = tmp_path_factory.mktemp("hostile-base")
    (root / "recv").mkdir()
    for k in range(2):
        save_file(lenet_state(k), str(root / "recv" / f"p{k}.safetensors"),
                  metadata={**HEAD, "mrtf.party": f"p{k}"})
    rng = np.random.default_rng(0)
    write_dataset(root / "target.h5", rng.random((M, 1, 8, 8), dtype=np.float32),
                  rng.integers(0, 10, M), ids=np.arange(M))
    probs = rng.random((M, 10)).astype(np.float32)
    write_labels(root / "labels.h5", LabelSet.from_probs(probs / probs.sum(1, keepdims=True)),
                 "test", {}, ["p0"])
    return root


def party(path: Path, head: dict | None = None, state: dict | None = None) -> Path:
    """A safetensors party file with header keys replaced (None removes a key)."""
    meta = {k: v for k, v in {**HEAD, **(head or {})}.items() if v is not None}
    save_file(lenet_state() if state is None else state, str(path), metadata=meta)
    return path


def recv_with(w: Path, base: Path, name: str | None = "evil.safetensors", **kw) -> Path:
    """A copy of the valid received directory plus one party ``name`` (None: none) built
    with ``party(**kw)``."""
    d = w / "recv"
    d.mkdir()
    for p in (base / "recv").iterdir():
        (d / p.name).write_bytes(p.read_bytes())
    if name is not None:
        party(d / name, **kw)
    return d


def refine_args(recv: Path, data: Path, w: Path) -> list[str]:
    return ["refine", str(recv), "--data", str(data), "--labels", str(w / "out" / "l.h5"),
            "--model", str(w / "out" / "m.safetensors"), "--steps", "2", "-q"]


def label_args(model: Path, data: Path, w: Path) -> list[str]:
    return ["label", str(model), "--data", str(data), "--labels", str(w / "out" / "l.h5"), "-q"]


def scaled(value: float, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    return {k: (torch.full_like(v, value, dtype=dtype) if v.is_floating_point() else v)
            for k, v in lenet_state().items()}


def cast(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in lenet_state().items()}


def target(w: Path, x: np.ndarray, name: str = "t.h5") -> Path:
    with h5py.File(w / name, "w") as f:
        f["x"] = x
    return w / name


# ------------------------------------------------------------------ hostile file builders


def zip_bomb(path: Path, unpacked: int = 2 << 30) -> Path:
    """A torch-style zip whose one entry inflates ``unpacked`` zero bytes from ~2 MB: the
    deflate output of a fully flushed 1 MiB block of zeros repeats, so it is built without
    compressing 2 GiB (the CRC is not computed; the size check must refuse it first)."""
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = co.compress(bytes(1 << 20)) + co.flush(zlib.Z_FULL_FLUSH)
    data = block * (unpacked >> 20) + co.flush()
    entries = [("archive/data.pkl", b"\x80\x02}q\x00.", 0), ("archive/data/0", data, 8)]
    out, central = bytearray(), bytearray()
    for name, payload, method in entries:
        size = len(payload) if method == 0 else unpacked
        crc = zlib.crc32(payload) if method == 0 else 0
        fields = (20, 0, method, 0, 0x21, crc, len(payload), size, len(name), 0)
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, *fields, 0, 0, 0, 0,
                               len(out)) + name.encode()
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, *fields) + name.encode() + payload
    out += central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries),
                                 len(central), len(out), 0)
    path.write_bytes(bytes(out))
    path.with_suffix(".json").write_text(json.dumps(HEAD))
    return path


def npy_header_only(path: Path, shape: tuple[int, ...]) -> Path:
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": shape})
        f.write(bytes(64))
    return path


def png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG that declares width × height pixels and holds none (PIL reads the header)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
                     + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))
    return path


def virtual_rows(w: Path, rows: int) -> Path:
    layout = h5py.VirtualLayout(shape=(rows, 1, 8, 8), dtype="f4")
    layout[0:4] = h5py.VirtualSource(str(w / "absent.h5"), "x", shape=(4, 1, 8, 8))
    with h5py.File(w / "vds.h5", "w") as f:
        f.create_virtual_dataset("x", layout, fillvalue=0)
    return w / "vds.h5"


def declared_only(w: Path, shape: tuple[int, ...]) -> Path:
    """A plain chunked dataset that declares ``shape`` and stores nothing (reads as zeros)."""
    with h5py.File(w / "declared.h5", "w") as f:
        f.create_dataset("x", shape=shape, dtype="f4", chunks=(1, *shape[1:]))
    return w / "declared.h5"


def corrupt_chunks(w: Path) -> Path:
    path = w / "corrupt.h5"
    x = np.random.default_rng(0).random((M, 1, 8, 8), dtype=np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(16, 1, 8, 8), compression="gzip")
        offsets = [f["x"].id.get_chunk_info(i) for i in range(f["x"].id.get_num_chunks())]
    with open(path, "r+b") as fh:
        for info in offsets:
            fh.seek(info.byte_offset + 8)
            fh.write(b"\xff" * 64)
    return path


def truth_declared(w: Path, rows: int) -> Path:
    with h5py.File(w / "truth.h5", "w") as f:
        f.create_dataset("x", shape=(rows, 1, 8, 8), dtype="f4", chunks=(1, 1, 8, 8))
        f.create_dataset("y", shape=(rows,), dtype="i8", chunks=(1024,))
    return w / "truth.h5"


def truth(w: Path, y: np.ndarray) -> Path:
    with h5py.File(w / "truth.h5", "w") as f:
        f["x"] = np.zeros((M, 1, 8, 8), np.float32)
        f["y"] = y
    return w / "truth.h5"


def link(w: Path, base: Path, to: str | Path, name: str = "link.safetensors") -> list[str]:
    recv = recv_with(w, base, None)
    os.symlink(to, recv / name)
    return refine_args(recv, base / "target.h5", w)


def in_recv(w: Path, base: Path, make: Callable[[Path], object]) -> list[str]:
    """refine on the valid received directory plus whatever ``make(directory)`` adds."""
    recv = recv_with(w, base)
    make(recv)
    return refine_args(recv, base / "target.h5", w)


def png_folder(w: Path, width: int, height: int) -> Path:
    (w / "imgs").mkdir()
    png_header_only(w / "imgs" / "a.png", width, height)
    return w / "imgs"


def truncated_npz(w: Path) -> Path:
    np.savez(w / "a.npz", x=np.zeros((8, 8, 8)))
    (w / "t.npz").write_bytes((w / "a.npz").read_bytes()[:300])
    return w / "t.npz"


def saved(path: Path, array: np.ndarray) -> Path:
    np.save(path, array)
    return path


def npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def pickled_module_pt(w: Path) -> Path:
    torch.save({"w": torch.nn.Linear(2, 2)}, w / "m.pt")  # a module: code, not tensors
    (w / "m.json").write_text(json.dumps(HEAD))
    return w / "m.pt"


def dev_zero_model(w: Path) -> Path:
    os.symlink("/dev/zero", w / "z.safetensors")
    return w / "z.safetensors"


def labels_into(w: Path, base: Path, path: Path) -> list[str]:
    return ["label", str(base / "recv" / "p0.safetensors"), "--data", str(base / "target.h5"),
            "--labels", str(path)]


def parent_is_a_file(w: Path, base: Path) -> list[str]:
    (w / "afile").write_text("x")
    return labels_into(w, base, w / "afile" / "l.h5")


def overflow_after_the_probe(w: Path, base: Path) -> list[str]:
    """The first 256 rows (the probe) are fine, later ones overflow inside the refinery."""
    recv = recv_with(w, base, state=scaled(1e5))
    x = np.random.default_rng(0).random((320, 1, 8, 8), dtype=np.float32)
    x[256:] = 9e5
    return refine_args(recv, target(w, x), w) + ["--clr-min-round", "0"]


# ------------------------------------------------------------------ the cases


@dataclass
class Case:
    id: str
    build: Callable[[Path, Path], list[str]]  # (workspace, base) → mrtf arguments
    message: str  # in the one stderr line
    memory: bool = False  # its old failure exhausted memory: run under RLIMIT_AS


def _overflow_party(w: Path, base: Path) -> list[str]:
    recv = recv_with(w, base, state=scaled(9e5))
    return refine_args(recv, target(w, np.full((M, 1, 8, 8), 9e5, np.float32)), w)


REFUSED = [
    # memory exhaustion from metadata (bounded before anything is built)
    Case("image_size-3000-inspect", lambda w, b: [
        "inspect", str(party(w / "big.safetensors", {"mrtf.arch_kwargs": json.dumps(
            {"in_channels": 1, "image_size": 3000})}))], "image_size must be in [1, 512]", True),
    Case("image_size-3000-refine", lambda w, b: refine_args(recv_with(w, b, head={
        "mrtf.arch_kwargs": '{"in_channels": 1, "image_size": 3000}'}), b / "target.h5", w),
         "image_size must be in [1, 512]", True),
    Case("image_size-3000-label", lambda w, b: label_args(party(w / "big.safetensors", {
        "mrtf.arch_kwargs": '{"in_channels": 1, "image_size": 3000}'}), b / "target.h5", w),
         "image_size must be in [1, 512]", True),
    Case("in_channels-1e6", lambda w, b: ["inspect", str(party(w / "c.safetensors", {
        "mrtf.arch_kwargs": '{"in_channels": 1000000, "image_size": 8}'}))],
         "in_channels must be in [1, 64]", True),
    Case("parameters-over-cap", lambda w, b: ["inspect", str(party(w / "mlp.safetensors", {
        "mrtf.arch": "mlp", "mrtf.arch_kwargs": '{"in_channels": 64, "image_size": 512}'}))],
         "parameters, more than the 50,000,000 allowed", True),
    Case("declared-shape-mismatch", lambda w, b: ["inspect", str(party(
        w / "s.safetensors", state={**lenet_state(), "classifier.4.weight": torch.zeros(3, 84)}
    ))], "classifier.4.weight has shape (3, 84)", True),
    Case("zip-bomb-pt", lambda w, b: ["inspect", str(zip_bomb(w / "bomb.pt"))],
         "unpacks to 2.0 GiB, more than the 1.0 GiB allowed", True),
    Case("virtual-dataset-1e8-rows", lambda w, b: refine_args(
        b / "recv", virtual_rows(w, 10**8), w), "'x' is a virtual dataset", True),
    Case("hdf5-1e8-rows-declared-refine", lambda w, b: refine_args(
        b / "recv", declared_only(w, (10**8, 1, 8, 8)), w),
         "refining 100,000,000 samples with 2 models and 10 classes needs about", True),
    Case("hdf5-1e8-rows-declared-label", lambda w, b: label_args(
        b / "recv" / "p0.safetensors", declared_only(w, (10**8, 1, 8, 8)), w),
         "labeling 100,000,000 samples needs about", True),
    Case("hdf5-sample-of-1e10-values", lambda w, b: refine_args(
        b / "recv", declared_only(w, (4, 1, 100000, 100000)), w),
         "one sample of 'x' holds 10,000,000,000 values", True),
    Case("score-truth-1e10-rows-declared", lambda w, b: [
        "score", str(b / "labels.h5"), "--truth", str(truth_declared(w, 10**10))],
         "holds 64 labels but", True),
    Case("npy-header-1e12-floats", lambda w, b: [
        "convert", str(npy_header_only(w / "x.npy", (10**12,))), str(w / "out" / "d.h5")],
         "the header declares 3.6 TiB of data but the file holds 64 B", True),
    Case("png-30000x30000", lambda w, b: [
        "convert", str(png_folder(w, 30000, 30000)), str(w / "out" / "d.h5")],
         "image too large (more than 67,108,864 pixels declared", True),
    Case("png-9000x9000", lambda w, b: [
        "convert", str(png_folder(w, 9000, 9000)), str(w / "out" / "d.h5")],
         "image too large (9000×9000 pixels declared; at most 67,108,864)"),
    # tracebacks
    Case("n_samples-1e400", lambda w, b: refine_args(recv_with(w, b, head={
        "mrtf.n_samples": "1" + "0" * 400, "mrtf.label_counts": None}), b / "target.h5", w),
         "malformed metadata: integer of 401 characters is out of range"),
    Case("hdf5-corrupt-chunks-refine", lambda w, b: refine_args(
        b / "recv", corrupt_chunks(w), w), "cannot read 'x' (corrupt or truncated file"),
    Case("hdf5-corrupt-chunks-label", lambda w, b: label_args(
        b / "recv" / "p0.safetensors", corrupt_chunks(w), w), "cannot read 'x'"),
    Case("x-huge-finite-1e30", lambda w, b: refine_args(b / "recv", target(
        w, np.full((M, 1, 8, 8), 1e30, np.float32)), w), "'x' holds values up to 1e+30"),
    Case("score-y-1e12", lambda w, b: ["score", str(b / "labels.h5"), "--truth", str(
        truth(w, np.full(M, 10**12, np.int64)))], "'y' holds 1000000000000..1000000000000, "
         "outside the 10 classes"),
    Case("score-y-negative", lambda w, b: ["score", str(b / "labels.h5"), "--truth", str(
        truth(w, np.full(M, -5, np.int64)))], "'y' holds -5..-5, outside the 10 classes"),
    # exit 0 with garbage before
    Case("f64-weights-1e300", lambda w, b: refine_args(recv_with(
        w, b, state=scaled(1e300, torch.float64)), b / "target.h5", w),
         "holds values up to 1e+300"),
    Case("f32-weights-3e38", lambda w, b: refine_args(recv_with(
        w, b, state=scaled(3e38)), b / "target.h5", w), "holds values up to 3e+38"),
    Case("x-3e38", lambda w, b: label_args(b / "recv" / "p0.safetensors", target(
        w, np.full((M, 1, 8, 8), 3e38, np.float32)), w), "'x' holds values up to 3e+38"),
    Case("outputs-overflow-refine", _overflow_party, "its outputs on t.h5 are not finite"),
    Case("outputs-overflow-after-the-probe", overflow_after_the_probe,
         "clustering failed on non-finite features"),
    Case("outputs-overflow-label", lambda w, b: label_args(party(
        w / "o.safetensors", state=scaled(9e5)), target(
        w, np.full((M, 1, 8, 8), 9e5, np.float32)), w),
         "the model's outputs are not finite for 64 of 64 samples"),
    # silently accepted before
    Case("int8-weights", lambda w, b: refine_args(recv_with(
        w, b, state=cast(torch.int8)), b / "target.h5", w), "is stored as int8; weights must "
         "be floating point"),
    Case("bool-weights", lambda w, b: refine_args(recv_with(
        w, b, state=cast(torch.bool)), b / "target.h5", w), "is stored as bool"),
    Case("x-int64", lambda w, b: refine_args(b / "recv", target(
        w, np.ones((M, 1, 8, 8), np.int64)), w), "'x' has dtype int64"),
    Case("round-1e400", lambda w, b: refine_args(recv_with(w, b, head={
        "mrtf.round": "1" + "0" * 400}), b / "target.h5", w), "malformed metadata"),
    Case("round-over-cap", lambda w, b: refine_args(recv_with(w, b, head={
        "mrtf.round": str(10**7)}), b / "target.h5", w), "mrtf.round must be in [0, 1000000]"),
    Case("n_samples-disagrees", lambda w, b: refine_args(recv_with(w, b, head={
        "mrtf.n_samples": "51"}), b / "target.h5", w),
         "mrtf.n_samples (51) disagrees with the sum of mrtf.label_counts (50)"),
    Case("n_samples-zero", lambda w, b: refine_args(recv_with(w, b, head={
        "mrtf.n_samples": "0", "mrtf.label_counts": None}), b / "target.h5", w),
         "mrtf.n_samples must be in [1, 1000000000000], got 0"),
    Case("label_counts-all-zero", lambda w, b: refine_args(recv_with(w, b, head={
        "mrtf.n_samples": None, "mrtf.label_counts": json.dumps([0] * 10)}),
        b / "target.h5", w), "mrtf.label_counts are all zero"),
    Case("train_loss-negative", lambda w, b: refine_args(recv_with(w, b, head={
        "mrtf.train_loss": "-1.5"}), b / "target.h5", w),
         "mrtf.train_loss must be a finite number in [0, 1e+06], got -1.5"),
    Case("symlink-to-dev-zero", lambda w, b: link(w, b, "/dev/zero"), "a symbolic link"),
    Case("symlink-loop", lambda w, b: link(w, b, "link.safetensors"), "a symbolic link"),
    Case("symlink-outside", lambda w, b: link(w, b, b / "recv" / "p0.safetensors"),
         "a symbolic link"),
    Case("fifo-entry", lambda w, b: in_recv(w, b, lambda d: os.mkfifo(d / "f.safetensors")),
         "f.safetensors: not a regular file (a FIFO, socket or device)"),
    Case("subdir-entry", lambda w, b: in_recv(w, b, lambda d: (d / "d.safetensors").mkdir()),
         "d.safetensors: a directory"),
    Case("model-arg-to-dev-zero", lambda w, b: label_args(dev_zero_model(w), b / "target.h5",
                                                          w),
         "not a regular model file (a character device)"),
    # silent data loss before
    Case("labels-equals-model", lambda w, b: [
        "refine", str(b / "recv"), "--data", str(b / "target.h5"), "--labels",
        str(w / "out" / "x"), "--model", str(w / "out" / "x"), "--steps", "2"],
         "given as two outputs"),
    Case("output-equals-input", lambda w, b: [
        "label", str(b / "recv" / "p0.safetensors"), "--data", str(b / "target.h5"),
        "--labels", str(b / "target.h5"), "--force"], "output would overwrite an input"),
    # checked too late before
    Case("output-parent-is-a-file", parent_is_a_file, "not a directory, cannot hold an output"),
    Case("output-name-300-chars", lambda w, b: labels_into(w, b, w / ("n" * 297 + ".h5")),
         "file name too long (300 bytes, at most 255 here)"),
    # convert
    Case("npz-truncated", lambda w, b: [
        "convert", str(truncated_npz(w)), str(w / "out" / "d.h5")], "not a readable .npz archive"),
    Case("npy-strings", lambda w, b: [
        "convert", str(saved(w / "s.npy", np.array(["a", "bc"]))), str(w / "out" / "d.h5")],
         "holds <U2 values"),
    Case("npz-string-y", lambda w, b: [
        "convert", str(npz(w / "a.npz", x=np.zeros((2, 8, 8)), y=np.array(["cat", "dog"]))),
        str(w / "out" / "d.h5")], "a.npz[y]: holds <U3 values"),
    # messages
    Case("pickle-with-code-pt", lambda w, b: ["inspect", str(pickled_module_pt(w))],
         "refused to load: the pickle holds objects other than tensors"),
]


def snapshot(root: Path) -> dict[str, int]:
    """Every entry under ``root`` (hidden ones too, links not followed) with its size."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = p.lstat().st_size if not p.is_dir() else -1
    return out


def assert_refused(code: int, stderr: str, output: str, message: str) -> None:
    lines = stderr.strip().splitlines()
    assert code == 2, (code, output)
    assert len(lines) == 1, stderr
    assert lines[0].startswith("mrtf: error: ") and message in lines[0], lines[0]
    assert "Traceback" not in output and "weights_only=False" not in output


@pytest.fixture(scope="module")
def memory_results(base, tmp_path_factory) -> dict[str, dict]:
    """Run every memory case in one subprocess under RLIMIT_AS (one torch import for all)."""
    root = tmp_path_factory.mktemp("memory-cases")
    plan = {}
    for case in (c for c in REFUSED if c.memory):
        w = root / case.id
        w.mkdir()
        args = case.build(w, base)
        plan[case.id] = {"args": args, "dir": str(w), "before": snapshot(w)}
    driver = f"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({AS_LIMIT}, {AS_LIMIT}))
from click.testing import CliRunner
from mrtf.cli.main import cli
plan = json.load(open(sys.argv[1]))
out = {{}}
for key, item in plan.items():
    res = CliRunner().invoke(cli, item["args"])
    out[key] = {{"code": res.exit_code, "stderr": res.stderr, "output": res.output,
                "exception": repr(res.exception)}}
json.dump(out, open(sys.argv[2], "w"))
"""
    (root / "plan.json").write_text(json.dumps(plan))
    proc = subprocess.run([sys.executable, "-c", driver, str(root / "plan.json"),
                           str(root / "results.json")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((root / "results.json").read_text())
    for key, item in plan.items():
        results[key]["unchanged"] = snapshot(Path(item["dir"])) == item["before"]
    return results


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_refused(case: Case, base: Path, tmp_path: Path, memory_results) -> None:
    if case.memory:
        r = memory_results[case.id]
        assert_refused(r["code"], r["stderr"], r["output"], case.message)
        assert r["unchanged"], "the command wrote something"
        return
    args = case.build(tmp_path, base)
    before, base_before = snapshot(tmp_path), snapshot(base)
    res = CliRunner().invoke(cli, args)
    assert_refused(res.exit_code, res.stderr, res.output, case.message)
    assert snapshot(tmp_path) == before, "the command wrote something"
    assert snapshot(base) == base_before


# ------------------------------------------------------------------ accepted, with a warning


@dataclass
class Accepted:
    id: str
    build: Callable[[Path, Path], list[str]]
    warning: str | None  # in a "mrtf: warning:" line on stderr (None: no warning)
    outputs: tuple[str, ...] = ("out/l.h5",)


def _note_dir(w: Path, base: Path, make: Callable[[Path], object]) -> list[str]:
    return in_recv(w, base, make)[:-1]  # not quiet: warnings shown


def _stale(w: Path, base: Path) -> list[str]:
    """What a SIGKILL during the write leaves: a temporary file and a lock file."""
    (w / "out").mkdir()
    (w / "out" / ".l.h5.k1ll3d00.tmp").write_bytes(b"half-written")
    (w / "out" / ".l.h5.lock").write_bytes(b"")
    return label_args(base / "recv" / "p0.safetensors", base / "target.h5", w)


ACCEPTED = [
    Accepted("float16-weights", lambda w, b: label_args(party(
        w / "h.safetensors", state=cast(torch.float16)), b / "target.h5", w)[:-1],
        "h.safetensors: weights stored as float16 were converted to float32"),
    Accepted("bfloat16-weights", lambda w, b: label_args(party(
        w / "h.safetensors", state=cast(torch.bfloat16)), b / "target.h5", w)[:-1],
        "weights stored as bfloat16 were converted to float32"),
    Accepted("float64-weights", lambda w, b: refine_args(recv_with(
        w, b, state=cast(torch.float64)), b / "target.h5", w)[:-1],
        "evil.safetensors: weights stored as float64 were converted to float32",
        ("out/l.h5", "out/m.safetensors")),
    Accepted("other-file-in-received", lambda w, b: _note_dir(
        w, b, lambda d: (d / "notes.txt").write_text("hi")),
        "skipped notes.txt (not a .safetensors or .pt model)", ("out/l.h5", "out/m.safetensors")),
    Accepted("sub-directory-in-received", lambda w, b: _note_dir(
        w, b, lambda d: (d / "ckpt").mkdir()),
        "skipped ckpt: a directory (received directories are not searched recursively)",
        ("out/l.h5", "out/m.safetensors")),
    Accepted("fifo-and-link-loop-in-received", lambda w, b: _note_dir(
        w, b, lambda d: (os.mkfifo(d / "pipe"), os.symlink("loop", d / "loop"))),
        "skipped loop: a symbolic link", ("out/l.h5", "out/m.safetensors")),
    Accepted("output-name-250-chars", lambda w, b: [
        *label_args(b / "recv" / "p0.safetensors", b / "target.h5", w)[:-3], "--labels",
        str(w / "out" / ("n" * 247 + ".h5"))], None, ("out/" + "n" * 247 + ".h5",)),
    Accepted("stale-temp-and-lock-of-a-killed-run", _stale, None),
]


@pytest.mark.parametrize("case", ACCEPTED, ids=[c.id for c in ACCEPTED])
def test_accepted_with_warning(case: Accepted, base: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, case.build(tmp_path, base))
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    warnings = [x for x in res.stderr.splitlines() if x.startswith("mrtf: warning: ")]
    if case.warning is None:
        assert warnings == []
    else:
        assert any(case.warning in x for x in warnings), res.stderr
    for rel in case.outputs:
        assert (tmp_path / rel).is_file()
    # only the outputs: no temporary or lock file, fresh or stale
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        Path(rel).name for rel in case.outputs)


# ------------------------------------------------------------------ outputs and processes


def test_same_output_locked_by_another_run_is_refused(base, tmp_path):
    from mrtf.io.outputs import Outputs

    args = label_args(base / "recv" / "p0.safetensors", base / "target.h5", tmp_path)
    with Outputs([tmp_path / "out" / "l.h5"]):  # another run holds the output
        before = snapshot(tmp_path)
        res = CliRunner().invoke(cli, args)
        assert_refused(res.exit_code, res.stderr, res.output,
                       "another mrtf run is writing this output now")
        assert snapshot(tmp_path) == before
    assert CliRunner().invoke(cli, args).exit_code == 0  # released: the next run proceeds


def test_read_only_output_folder(base, tmp_path, monkeypatch):
    """A real read-only folder when not root; as root (permissions do not apply) creating the
    temporary file is made to fail with EACCES, which is what the kernel would answer."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        ro.chmod(0o555)
    else:
        import mrtf.io.outputs as outputs

        def denied(target):
            raise PermissionError(errno.EACCES, "Permission denied", str(target))
        monkeypatch.setattr(outputs, "make_temp", denied)
    before = snapshot(tmp_path)
    res = CliRunner().invoke(cli, ["label", str(base / "recv" / "p0.safetensors"), "--data",
                                   str(base / "target.h5"), "--labels", str(ro / "l.h5")])
    ro.chmod(0o755)
    assert_refused(res.exit_code, res.stderr, res.output, "cannot write here (Permission denied)")
    assert snapshot(tmp_path) == before


def test_not_enough_free_space_is_refused_before_the_work(base, tmp_path, monkeypatch):
    import shutil

    import mrtf.io.outputs as outputs

    monkeypatch.setattr(outputs.shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(100, 100, 0))
    before = snapshot(tmp_path)
    res = CliRunner().invoke(cli, refine_args(base / "recv", base / "target.h5", tmp_path))
    assert_refused(res.exit_code, res.stderr, res.output, "0 B free, the outputs need about")
    assert snapshot(tmp_path) == before


def test_disk_full_during_the_write(base, tmp_path, monkeypatch):
    """ENOSPC in the middle of writing the labels, simulated in-process (no unprivileged tiny
    tmpfs here): one line, and the half-written temporary file is removed."""
    import mrtf.cli.refine as refine_mod

    real = refine_mod.write_labels

    def full(path, *a, **k):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(refine_mod, "write_labels", full)
    before = snapshot(tmp_path)
    res = CliRunner().invoke(cli, refine_args(base / "recv", base / "target.h5", tmp_path))
    assert_refused(res.exit_code, res.stderr, res.output,
                   "l.h5: write failed (No space left on device)")
    assert snapshot(tmp_path) == before
    assert real is not full


def _mrtf_process(args: list[str], preamble: str = "") -> subprocess.Popen:
    code = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
            f"{preamble}from mrtf.cli.main import cli; cli()")
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_file_too_large_during_the_write(base, tmp_path):
    """A real write failure: RLIMIT_FSIZE of 8 KiB makes the labels write fail (EFBIG)."""
    before = snapshot(tmp_path)
    proc = _mrtf_process(label_args(base / "recv" / "p0.safetensors", base / "target.h5",
                                    tmp_path),
                         "import resource; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
                         "resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192)); ")
    _, err = proc.communicate(timeout=300)
    assert_refused(proc.returncode, err, err, "l.h5: write failed (File too large)")
    assert snapshot(tmp_path) == before


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


LONG = ["--steps", "1000000"]  # a refine that runs until it is signalled


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "terminated"),
                                             (signal.SIGINT, 130, "interrupted")])
def test_signal_during_the_run_leaves_nothing(base, tmp_path, sig, code, word):
    before = snapshot(tmp_path)
    proc = _mrtf_process(refine_args(base / "recv", base / "target.h5", tmp_path) + LONG)
    try:
        _wait_for(tmp_path / "out" / ".l.h5.lock", proc)
        # a second run on the same output, while the first one works: refused at once
        res = CliRunner().invoke(cli, label_args(base / "recv" / "p0.safetensors",
                                                 base / "target.h5", tmp_path))
        assert_refused(res.exit_code, res.stderr, res.output, "another mrtf run is writing")
        time.sleep(1.0)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    lines = err.strip().splitlines()
    assert proc.returncode == code and len(lines) == 1 and word in lines[0], err
    assert "unfinished outputs were removed" in lines[0]
    assert snapshot(tmp_path) == before


def test_sigkill_leftovers_are_cleaned_by_the_next_run(base, tmp_path):
    args = refine_args(base / "recv", base / "target.h5", tmp_path)
    proc = _mrtf_process(args + LONG)
    try:
        _wait_for(tmp_path / "out" / ".m.safetensors.lock", proc)
        time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=120)
    finally:
        proc.kill()
    left = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert left and all(n.startswith(".") for n in left)  # temporaries and locks only
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["l.h5", "m.safetensors"]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_outputs_honour_the_umask(base, tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        res = CliRunner().invoke(cli, label_args(base / "recv" / "p0.safetensors",
                                                 base / "target.h5", tmp_path))
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "out" / "l.h5").stat().st_mode & 0o777 == mode


def test_simulate_run_dir_with_stray_temporaries(tmp_path):
    """A killed `simulate` leaves `.NAME.XXXXXXXX.tmp` files: they are removed, not a reason
    to refuse the directory (with or without --force)."""
    from mrtf.federated.runner import RunConfig, prepare_out

    out = tmp_path / "run"
    out.mkdir()
    (out / ".metrics.jsonl.abcd1234.tmp").write_text("{")
    assert prepare_out(RunConfig(dataset="digits"), out, resume=False, force=False) is False
    assert list(out.iterdir()) == []
    (out / "metrics.jsonl").write_text("{}")
    (out / ".summary.md.abcd1234.tmp").write_text("#")
    assert prepare_out(RunConfig(dataset="digits"), out, resume=False, force=True) is False
    assert list(out.iterdir()) == []
