"""Hostile files for tests/test_hostile_inputs.py and tests/test_hostile_outputs.py, built
on the fly and small (the largest, the zip bomb, is ~2 MB on disk)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import torch
from safetensors.torch import save_file

from mrtf.io import LabelSet, write_dataset, write_labels
from mrtf.models import build_model

KW = {"in_channels": 1, "image_size": 8}
HEAD = {"mrtf.arch": "lenet", "mrtf.num_classes": "10", "mrtf.arch_kwargs": json.dumps(KW),
        "mrtf.role": "local", "mrtf.label_counts": json.dumps([5] * 10),
        "mrtf.n_samples": "50", "mrtf.train_loss": "1.0", "mrtf.round": "1"}
M = 64  # target samples


# ------------------------------------------------------------------ shared valid inputs


def lenet_state(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return build_model("lenet", 10, **KW).state_dict()


def make_base(root: Path) -> Path:
    """Two valid LeNet parties, a target set (x, y, ids) and a labels file for it."""
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



# ------------------------------------------------------------------ round 2 (issue 35)


def target_with(w: Path, name: str = "t.h5", **columns: object) -> Path:
    """A valid target set (x of M rows, y in 0..9) plus ``columns``: arrays, or callables
    that get the open file and the column name and make the entry themselves (links,
    declared shapes); None leaves a column out."""
    path = w / name
    with h5py.File(path, "w") as f:
        f["x"] = np.random.default_rng(0).random((M, 1, 8, 8), dtype=np.float32)
        for key, value in {"y": np.arange(M) % 10, **columns}.items():
            if value is None:
                continue
            if callable(value):
                if key in f:
                    del f[key]
                value(f, key)
            else:
                f[key] = value
    return path


def soft_loop(f: h5py.File, key: str) -> None:
    f[key] = h5py.SoftLink(f"/{key}")


def soft_to_plain(f: h5py.File, key: str) -> None:
    """A soft link to a plain dataset of the same file (no loop)."""
    f[f"{key}_data"] = np.zeros((M, 1, 8, 8), np.float32) if key == "x" else np.arange(M)
    f[key] = h5py.SoftLink(f"/{key}_data")


def external_to(target: Path, path: str = "/x") -> Callable[[h5py.File, str], None]:
    def make(f: h5py.File, key: str) -> None:
        f[key] = h5py.ExternalLink(str(target), path)
    return make


def text_ids(rows: list[bytes]) -> Callable[[h5py.File, str], None]:
    """``ids`` as variable-length UTF-8 strings holding ``rows`` as raw bytes."""
    def make(f: h5py.File, key: str) -> None:
        f.create_dataset(key, data=np.array(rows, dtype=object),
                         dtype=h5py.string_dtype("utf-8"))
    return make


def declared(shape: tuple[int, ...], dtype: str, chunks: tuple[int, ...]
             ) -> Callable[[h5py.File, str], None]:
    """A column that declares ``shape`` and stores nothing (reads as zeros)."""
    def make(f: h5py.File, key: str) -> None:
        f.create_dataset(key, shape=shape, dtype=dtype, chunks=chunks)
    return make


def many_files(w: Path, base: Path, count: int) -> Path:
    """The valid received directory plus ``count`` empty model files (a flood)."""
    recv = recv_with(w, base, None)
    for i in range(count):
        (recv / f"f{i:05d}.safetensors").touch()
    return recv


def raw_safetensors(path: Path, header: bytes, data: bytes) -> Path:
    """A safetensors file from a header written by hand (JSON text, not checked)."""
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


def duplicate_tensor(path: Path, head: dict | None = None) -> Path:
    """A valid LeNet party whose header lists its last tensor twice (same bytes): a reader
    keeping one of them loads a different model than one keeping the other."""
    state = lenet_state()
    meta = {k: v for k, v in {**HEAD, **(head or {})}.items() if v is not None}
    entries, data = [], b""
    for key in sorted(state):
        t = state[key].contiguous()
        raw = t.numpy().tobytes()
        entries.append(json.dumps(key) + ":" + json.dumps(
            {"dtype": "F32", "shape": list(t.shape), "data_offsets": [len(data),
                                                                      len(data) + len(raw)]}))
        data += raw
    entries.append(entries[-1])
    text = "{" + json.dumps("__metadata__") + ":" + json.dumps(meta) + "," + ",".join(entries)
    return raw_safetensors(path, (text + "}").encode(), data)


def duplicate_metadata_key(path: Path) -> Path:
    """A party whose ``__metadata__`` gives ``mrtf.role`` twice: local, then global."""
    party(path)
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    text = data[8:8 + size].decode().replace('"mrtf.role":"local"',
                                               '"mrtf.role":"local","mrtf.role":"global"')
    return raw_safetensors(path, text.encode(), data[8 + size:])


def huge_party_name(path: Path, size: int) -> Path:
    """A safetensors file whose header holds a party name of ``size`` bytes, written in
    pieces (the test process never holds it)."""
    state = lenet_state()
    offsets, data = {}, b""
    for key in sorted(state):
        raw = state[key].contiguous().numpy().tobytes()
        offsets[key] = {"dtype": "F32", "shape": list(state[key].shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    head = json.dumps({**HEAD, "mrtf.party": ""})[:-1].replace('"mrtf.party": ""', "")
    start = ('{"__metadata__":' + head + '"mrtf.party":"').encode()
    end = ('"},' + json.dumps(offsets)[1:]).encode()
    with open(path, "wb") as f:
        f.write((len(start) + size + len(end)).to_bytes(8, "little") + start)
        for done in range(0, size, 1 << 20):
            f.write(b"x" * min(1 << 20, size - done))
        f.write(end + data)
    return path


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


#: the environment of the subprocess that runs measured cases: one thread, no GPU, few arenas
CASE_ENV = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "MALLOC_ARENA_MAX": "2"}


def run_plan(root: Path, plan: dict[str, dict], driver: str) -> dict[str, dict]:
    """Run ``driver`` (Python source: reads the plan's JSON from argv[1], writes each case's
    result as JSON to argv[2]) in one subprocess with :data:`CASE_ENV`, and add to each result
    whether the case's folder (``item["dir"]``) was left as ``item["before"]`` found it."""
    (root / "plan.json").write_text(json.dumps(plan))
    proc = subprocess.run([sys.executable, "-c", driver, str(root / "plan.json"),
                           str(root / "results.json")], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **CASE_ENV})
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((root / "results.json").read_text())
    for key, item in plan.items():
        results[key]["unchanged"] = snapshot(Path(item["dir"])) == item["before"]
    return results
