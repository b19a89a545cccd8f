"""Hostile inputs (issue 11): each is refused with one line on stderr and exit code 2, no
traceback, and nothing written (no output, no temporary or lock file), or accepted with a
warning and a documented conversion.

Every hostile file is built on the fly by tests/hostile_files.py and is small (the largest,
the zip bomb, is ~2 MB on disk). Hostile output conditions (locks, full disks, signals) are
in tests/test_hostile_outputs.py. Cases whose old failure was memory exhaustion run together
in one subprocess whose address space is capped with ``resource.setrlimit(RLIMIT_AS)`` (what
importing the CLI mapped + AS_HEADROOM), so a regression fails the test instead of the
machine. The others run in-process through click's CliRunner.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hostile_files import (
    M,
    assert_refused,
    cast,
    corrupt_chunks,
    declared_only,
    dev_zero_model,
    in_recv,
    label_args,
    labels_into,
    lenet_state,
    link,
    make_base,
    npy_header_only,
    npz,
    overflow_after_the_probe,
    parent_is_a_file,
    party,
    pickled_module_pt,
    png_folder,
    recv_with,
    refine_args,
    run_plan,  # the builders: one per kind of hostile file
    saved,
    scaled,
    snapshot,
    target,
    truncated_npz,
    truth,
    truth_declared,
    virtual_rows,
    zip_bomb,
)

from mrtf.cli.main import cli

# Address space the memory cases' subprocess may map beyond what importing the CLI mapped: the
# cap is set after the imports, since a CUDA build of torch maps several GB of libraries (a
# fixed 2 GiB cap made the import itself fail on an H100 machine). CPU torch maps ~0.8 GB, so
# this keeps the 2 GiB total the cases were written against there.
AS_HEADROOM = 5 << 28
# CUDA off, one thread: the cases test refusals, not devices, and every thread's malloc arena
# and stack is mapped address space.


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_base(tmp_path_factory.mktemp("hostile-base"))


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
         "outputs are not finite on 64 of 320 target samples"),
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
from click.testing import CliRunner
from mrtf.cli.main import cli
mapped = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + {AS_HEADROOM}, mapped + {AS_HEADROOM}))
plan = json.load(open(sys.argv[1]))
out = {{}}
for key, item in plan.items():
    res = CliRunner().invoke(cli, item["args"])
    out[key] = {{"code": res.exit_code, "stderr": res.stderr, "output": res.output,
                "exception": repr(res.exception)}}
json.dump(out, open(sys.argv[2], "w"))
"""
    return run_plan(root, plan, driver)


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
        "skipped notes.txt (not a .safetensors/.pt/.onnx model)",
        ("out/l.h5", "out/m.safetensors")),
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
