"""The standard datasets' files: where they live, what they must hash to, where they come from.

The data directory is ``data_dir`` when given, else ``$MRTF_DATA``, else
``$XDG_CACHE_HOME/mrtf/data`` (``~/.cache/mrtf/data`` without XDG_CACHE_HOME). Inside it the
layout is fixed (the same as ``../shared/data``)::

    mnist/train-images-idx3-ubyte.gz  mnist/train-labels-idx1-ubyte.gz
    mnist/t10k-images-idx3-ubyte.gz   mnist/t10k-labels-idx1-ubyte.gz
    usps/usps.h5
    mnist_m/mnist_m_test.npz

What is checked is the *content*, so that every honest copy verifies:

* MNIST ``.gz``: the sha256 of the uncompressed IDX bytes. LeCun's ``.gz`` files and a
  re-compression of them (our offline train-images copy is one) hash differently as ``.gz``
  but hold the same IDX bytes.
* USPS ``usps.h5``: the sha256 of its four arrays (train data, train target, test data, test
  target, as little-endian float32 / int64), since a copy rebuilt from the ESL ``zip.*.gz``
  files holds the same arrays in different HDF5 bytes.
* MNIST-M ``mnist_m_test.npz``: the sha256 of the file (no official single-file source exists;
  a mirror must serve exactly this file).

A verified file is remembered by (absolute path, size, mtime) for the process and in
``$XDG_CACHE_HOME/mrtf/verified.json`` (``~/.cache/mrtf/verified.json``; skipped when not
writable), so a 47 MB IDX file is not re-hashed on every load. Loading never writes into the
data directory, which may be read-only or shared.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from mrtf.errors import InputError
from mrtf.io.atomic import atomic_path

MB = 1 << 20


@dataclass(frozen=True)
class StandardFile:
    """One file of a standard dataset: its place in the data directory and its checksum."""

    dataset: str          # mnist, usps or mnistm
    path: str             # relative to the data directory
    sha256: str           # of the content named by ``check``
    check: str            # "gunzip" (uncompressed bytes), "usps-arrays" or "file"
    max_bytes: int        # bound on the file as stored (downloads and reads stop beyond it)
    urls: tuple[str, ...] = ()  # official sources of these exact bytes, in order of preference


_MNIST_URLS = ("https://ossci-datasets.s3.amazonaws.com/mnist/",
               "http://yann.lecun.com/exdb/mnist/")


def _mnist(name: str, sha: str, max_mb: int) -> StandardFile:
    return StandardFile("mnist", f"mnist/{name}", sha, "gunzip", max_mb * MB,
                        tuple(base + name for base in _MNIST_URLS))


FILES: tuple[StandardFile, ...] = (
    _mnist("train-images-idx3-ubyte.gz",
           "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db", 20),
    _mnist("train-labels-idx1-ubyte.gz",
           "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5", 1),
    _mnist("t10k-images-idx3-ubyte.gz",
           "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7", 5),
    _mnist("t10k-labels-idx1-ubyte.gz",
           "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2", 1),
    StandardFile("usps", "usps/usps.h5",
                 "c86f141b794d5eae494b7899eb24705766d6220bc1ef05045b16c4eca862fd9a",
                 "usps-arrays", 32 * MB),
    StandardFile("mnistm", "mnist_m/mnist_m_test.npz",
                 "a7ef5f5b430fc669362328cb336f7bc3ccfa51022ad01b3d115a7b8065720b61",
                 "file", 64 * MB),
)

# USPS has no official usps.h5: the official source is the ESL text files, converted to the
# same arrays (pixels (v + 1) / 2) by mrtf.data.fetch.
USPS_ESL_URLS = {split: f"https://hastie.su.domains/ElemStatLearn/datasets/zip.{split}.gz"
                 for split in ("train", "test")}

# Bound on uncompressed IDX content (train images: 47,040,016 bytes).
MAX_IDX_BYTES = 64 * MB

_VERIFIED: dict[tuple[str, int, int], str] = {}


def files_of(dataset: str) -> tuple[StandardFile, ...]:
    return tuple(f for f in FILES if f.dataset == dataset)


def file_named(relative: str) -> StandardFile:
    return next(f for f in FILES if f.path == relative)


def _user_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "mrtf"


def verified_cache_file() -> Path:
    """Where verifications are remembered across processes."""
    return _user_cache() / "verified.json"


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """``data_dir``, else ``$MRTF_DATA``, else ``$XDG_CACHE_HOME/mrtf/data`` or
    ``~/.cache/mrtf/data``."""
    if data_dir is not None and str(data_dir):
        return Path(data_dir).expanduser()
    if os.environ.get("MRTF_DATA"):
        return Path(os.environ["MRTF_DATA"]).expanduser()
    return _user_cache() / "data"


def read_gunzipped(path: Path, limit: int = MAX_IDX_BYTES) -> bytes:
    """The uncompressed bytes of a ``.gz`` file, refusing more than ``limit`` (a gzip bomb)."""
    try:
        with gzip.open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except (OSError, EOFError) as exc:
        raise InputError(f"{path}: not a readable gzip file ({exc})") from None
    if len(data) > limit:
        raise InputError(f"{path}: uncompressed content exceeds {limit // MB} MB")
    return data


def usps_arrays_digest(path: Path) -> str:
    """sha256 of usps.h5's arrays: train data, train target, test data, test target as
    little-endian float32 / int64 (bounded: shapes are checked before anything is read)."""
    digest = hashlib.sha256()
    try:
        with h5py.File(path, "r") as fh:
            for split in ("train", "test"):
                for key, dtype in (("data", "<f4"), ("target", "<i8")):
                    name = f"{split}/{key}"
                    node = fh.get(name)
                    if not isinstance(node, h5py.Dataset) or node.size > 4_000_000:
                        raise InputError(f"{path}: no usable {name!r} array")
                    arr = np.ascontiguousarray(node[()], dtype=dtype)
                    digest.update(arr.tobytes())
    except OSError as exc:
        raise InputError(f"{path}: not a readable HDF5 file ({exc})") from None
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(MB), b""):
            digest.update(block)
    return digest.hexdigest()


def content_digest(spec: StandardFile, path: Path) -> str:
    """The sha256 that ``spec.sha256`` is compared with (see the module's docstring)."""
    if spec.check == "gunzip":
        return hashlib.sha256(read_gunzipped(path)).hexdigest()
    if spec.check == "usps-arrays":
        return usps_arrays_digest(path)
    return file_digest(path)


def _key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns)


def _disk_cache() -> dict:
    try:
        data = json.loads(verified_cache_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _remember(spec: StandardFile, key: tuple[str, int, int]) -> None:
    _VERIFIED[key] = spec.sha256
    cache = {path: entry for path, entry in _disk_cache().items() if os.path.exists(path)}
    cache[key[0]] = {"size": key[1], "mtime_ns": key[2], "sha256": spec.sha256}
    try:
        with atomic_path(verified_cache_file()) as tmp:
            tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
    except OSError:
        pass  # no writable cache: remember for this process only


def is_verified(root: Path, spec: StandardFile) -> bool:
    """Whether the file was verified before at its present (size, mtime)."""
    path = root / spec.path
    key = _key(path)
    if _VERIFIED.get(key) == spec.sha256:
        return True
    entry = _disk_cache().get(key[0])
    if (isinstance(entry, dict) and entry.get("sha256") == spec.sha256
            and entry.get("size") == key[1] and entry.get("mtime_ns") == key[2]):
        _VERIFIED[key] = spec.sha256
        return True
    return False


def verify(root: Path, spec: StandardFile, path: Path | None = None) -> None:
    """Check the file's size bound and checksum (once per (path, size, mtime)); InputError
    otherwise. ``path`` defaults to its place in ``root``; another path (a download not yet
    renamed into place) is checked but not remembered."""
    target = path if path is not None else root / spec.path
    if path is None and is_verified(root, spec):
        return
    size = target.stat().st_size
    if size > spec.max_bytes:
        raise InputError(f"{target}: {size} bytes, more than {spec.max_bytes // MB} MB "
                         f"expected for {spec.path}")
    got = content_digest(spec, target)
    if got != spec.sha256:
        raise InputError(f"{target}: checksum mismatch for {spec.path} (sha256 of the "
                         f"{_WHAT[spec.check]} is {got[:16]}…, expected {spec.sha256[:16]}…); "
                         "delete it and run `mrtf data fetch " + spec.dataset + "`")
    if path is None:
        _remember(spec, _key(target))


def read_verified_gz(root: Path, spec: StandardFile) -> bytes:
    """A ``gunzip``-checked file's uncompressed bytes, verified (hashed once per (path,
    size, mtime), from the same bytes that are returned); InputError when missing or bad."""
    path = root / spec.path
    _missing(root, spec)
    if is_verified(root, spec):
        return read_gunzipped(path)
    if path.stat().st_size > spec.max_bytes:
        verify(root, spec)  # raises: too large
    data = read_gunzipped(path)
    if hashlib.sha256(data).hexdigest() != spec.sha256:
        verify(root, spec)  # raises the mismatch message
    _remember(spec, _key(path))
    return data


def _missing(root: Path, spec: StandardFile) -> None:
    path = root / spec.path
    if not path.is_file():
        raise InputError(f"{path}: missing; run `mrtf data fetch {spec.dataset}` (data "
                         f"directory {root}; give --data-dir or set MRTF_DATA to use another)")


_WHAT = {"gunzip": "uncompressed content", "usps-arrays": "arrays", "file": "file"}


def require(dataset: str, root: Path, relative: tuple[str, ...] | None = None) -> list[Path]:
    """The verified paths of ``dataset``'s files (or of ``relative`` ones); InputError naming
    ``mrtf data fetch`` when one is missing."""
    specs = [f for f in files_of(dataset) if relative is None or f.path in relative]
    out = []
    for spec in specs:
        _missing(root, spec)
        verify(root, spec)
        out.append(root / spec.path)
    return out
