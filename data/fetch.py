"""``mrtf data fetch``: download the standard datasets into the data directory, verified.

Sources (mrtf.data.registry): MNIST's four IDX ``.gz`` files from the ossci-datasets S3 mirror
of LeCun's files (then yann.lecun.com); USPS from the ESL ``zip.train.gz`` / ``zip.test.gz``
(Hastie, Tibshirani & Friedman's site), converted to ``usps.h5`` with pixels (v + 1) / 2 and
checked array by array; MNIST-M has no official single-file source, so it needs ``--mirror``
(a server laid out like the data directory) or a file placed by hand. ``mirror`` replaces
every official source: ``MIRROR/mnist/…``, ``MIRROR/usps/usps.h5``,
``MIRROR/mnist_m/mnist_m_test.npz``.

Each download goes to ``FILE.part`` beside its target (locked against a second fetch), resumes
with an HTTP Range request after a cut connection (from 0 when the server ignores Range), is
bounded in size, verified, and only then renamed into place; a file failing its checksum is
deleted. Network errors are retried ``retries`` times per source with a short back-off.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import http.client
import os
import re
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from mrtf.data.registry import (
    MB,
    USPS_ESL_URLS,
    StandardFile,
    files_of,
    mark_verified,
    resolve_data_dir,
    verify,
)
from mrtf.errors import InputError, first_line
from mrtf.io.atomic import atomic_path

DATASETS = ("mnist", "usps", "mnistm")
_CHUNK = 1 << 16
_ESL_MAX_BYTES = 8 * MB  # zip.train.gz is about 1.6 MB


@dataclass(frozen=True)
class FetchOptions:
    """How downloads behave: ``timeout`` seconds per connection and read, ``retries`` after
    a network error per source, ``backoff`` seconds before the first retry (doubling, at
    most 10), ``progress`` bars on stderr."""

    timeout: float = 30.0
    retries: int = 3
    backoff: float = 1.0
    progress: bool = False


@dataclass(frozen=True)
class FetchedFile:
    """One file of a fetch: where it is, where it came from, what happened."""

    path: Path
    source: str      # URL, or "" when it was already there
    status: str      # "present" (already verified), "downloaded" or "converted"


class _Retry(Exception):
    """A transient failure: try the same source again (resuming)."""


def fetch_dataset(name: str, data_dir: str | os.PathLike | None = None,
                  mirror: str | None = None, options: FetchOptions | None = None
                  ) -> list[FetchedFile]:
    """Make every file of ``name`` present and verified in the data directory."""
    if name not in DATASETS:
        raise InputError(f"unknown standard dataset {name!r}; choose from {', '.join(DATASETS)}")
    options = options or FetchOptions()
    root = resolve_data_dir(data_dir)
    base = _check_mirror(mirror) if mirror else None
    out = []
    for spec in files_of(name):
        target = root / spec.path
        if target.is_file() and _verifies(root, spec):
            out.append(FetchedFile(target, "", "present"))
        elif base is not None:
            out.append(_download_verified(root, spec, [f"{base}/{spec.path}"], options))
        elif spec.urls:
            out.append(_download_verified(root, spec, list(spec.urls), options))
        elif name == "usps":
            out.append(_usps_from_esl(root, spec, options))
        else:
            raise InputError(f"MNIST-M has no official single-file download: give --mirror URL "
                             f"(a server holding {spec.path}) or place the file at {target} "
                             f"(sha256 {spec.sha256})")
    return out


def _check_mirror(mirror: str) -> str:
    if not re.match(r"^(https?|file)://", mirror):
        raise InputError(f"--mirror {mirror!r}: give an http://, https:// or file:// URL")
    return mirror.rstrip("/")


def _verifies(root: Path, spec: StandardFile) -> bool:
    try:
        verify(root, spec)
        return True
    except InputError:
        return False  # a bad copy: downloaded again, replaced only once the new one verifies


def _download_verified(root: Path, spec: StandardFile, urls: list[str],
                       options: FetchOptions) -> FetchedFile:
    target = root / spec.path
    part = target.with_name(target.name + ".part")
    url = download(urls, part, spec.max_bytes, options)
    try:
        verify(root, spec, path=part)
    except InputError as exc:
        part.unlink(missing_ok=True)
        raise InputError(f"{url}: the download failed its check and was not kept ({exc})"
                         ) from None
    os.replace(part, target)
    mark_verified(spec, target)
    return FetchedFile(target, url, "downloaded")


def download(urls: list[str], part: Path, max_bytes: int, options: FetchOptions) -> str:
    """Download the first source that answers into ``part`` (resuming what it holds); the URL
    used. InputError (one line) when every source failed."""
    part.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    with _locked(part):
        for url in urls:
            for attempt in range(options.retries + 1):
                if attempt:
                    time.sleep(min(options.backoff * 2 ** (attempt - 1), 10.0))
                try:
                    _attempt(url, part, max_bytes, options)
                    return url
                except _Retry as exc:
                    errors.append(f"{url}: {exc}")
                except InputError:
                    part.unlink(missing_ok=True)  # too large: nothing worth resuming
                    raise
                except urllib.error.HTTPError as exc:
                    errors.append(f"{url}: HTTP {exc.code} {exc.reason}")
                    if exc.code < 500:
                        break  # not there: the next source
                except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
                    errors.append(f"{url}: {first_line(getattr(exc, 'reason', exc))}")
    kept = part.stat().st_size if part.exists() else 0
    if not kept:
        part.unlink(missing_ok=True)
    kept = f"; {kept} bytes kept in {part} to resume" if kept else ""
    raise InputError(f"download failed ({errors[-1]}; {len(errors)} tries){kept}")


@contextlib.contextmanager
def _locked(part: Path) -> Iterator[None]:
    # the lock is on the .part file itself: no lock file is left behind
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"{part}: another mrtf data fetch is downloading this file now"
                             ) from None
        yield
    finally:
        os.close(fd)


def _attempt(url: str, part: Path, max_bytes: int, options: FetchOptions) -> None:
    """One request: resume from ``part``'s size with a Range header; start over when the
    server answers 200 (it ignored Range) or resumes at another offset."""
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "mrtf-data-fetch"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                      timeout=options.timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:
            return  # nothing left to send: the file is complete (the check will tell)
        raise
    with resp:
        if have and (resp.status != 206 or _range_start(resp) != have):
            have = 0  # Range ignored: start again from the first byte
        length = resp.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else None
        if total is not None and total > max_bytes:
            raise InputError(f"{url}: {total} bytes, more than the {max_bytes // MB} MB "
                             "expected; not downloaded")
        have = _copy(resp, part, have, total, max_bytes, options)
    if total is not None and have < total:
        raise _Retry(f"connection closed after {have} of {total} bytes")


def _range_start(resp: http.client.HTTPResponse) -> int | None:
    match = re.match(r"bytes (\d+)-", resp.headers.get("Content-Range", ""))
    return int(match.group(1)) if match else None


def _copy(resp: http.client.HTTPResponse, part: Path, have: int, total: int | None,
          max_bytes: int, options: FetchOptions) -> int:
    from tqdm import tqdm

    with open(part, "ab" if have else "wb") as fh, \
            tqdm(total=total, initial=have, unit="B", unit_scale=True, leave=False,
                 desc=part.name.removesuffix(".part"), disable=not options.progress) as bar:
        while True:
            try:
                chunk = resp.read(_CHUNK)
            except (OSError, http.client.HTTPException) as exc:
                fh.flush()
                raise _Retry(f"connection lost after {have} bytes ({first_line(exc)})"
                             ) from None
            if not chunk:
                return have
            if have + len(chunk) > max_bytes:
                raise InputError(f"{part.name}: more than the {max_bytes // MB} MB expected; "
                                 "stopped")
            fh.write(chunk)
            have += len(chunk)
            bar.update(len(chunk))


def _usps_from_esl(root: Path, spec: StandardFile, options: FetchOptions) -> FetchedFile:
    """usps.h5 from the ESL text files: label, then 256 values in [-1, 1] per line; pixels
    (v + 1) / 2 in float32, 16×16 row-major; checked by the arrays' sha256."""
    target = root / spec.path
    arrays = {}
    for split, urls in USPS_ESL_URLS.items():
        part = target.with_name(f"zip.{split}.gz.part")
        url = download(list(urls), part, _ESL_MAX_BYTES, options)
        try:
            arrays[split] = parse_esl(part)
        except InputError as exc:
            part.unlink(missing_ok=True)
            raise InputError(f"{url}: not the ESL zip file, not kept ({exc})") from None
    with atomic_path(target) as tmp:
        with h5py.File(tmp, "w") as fh:
            for split, (x, y) in arrays.items():
                fh.create_dataset(f"{split}/data", data=x)
                fh.create_dataset(f"{split}/target", data=y)
        try:
            verify(root, spec, path=tmp)
        except InputError as exc:
            for split in arrays:
                target.with_name(f"zip.{split}.gz.part").unlink(missing_ok=True)
            raise InputError(f"USPS from {url}: the converted arrays failed "
                             f"their check and were not kept ({exc})") from None
    for split in arrays:
        target.with_name(f"zip.{split}.gz.part").unlink(missing_ok=True)
    mark_verified(spec, target)
    return FetchedFile(target, url.rsplit("/", 1)[0] + "/zip.{train,test}.gz", "converted")


def parse_esl(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """An ESL ``zip.*.gz`` file: (x float32 (N, 256) in [0, 1], y int32 (N,))."""
    try:
        with gzip.open(path, "rt", encoding="ascii") as fh:
            text = fh.read(32 * MB + 1)
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:
        raise InputError(f"not a gzip text file ({first_line(exc)})") from None
    if len(text) > 32 * MB:
        raise InputError("uncompressed text exceeds 32 MB")
    try:
        rows = np.array([line.split() for line in text.splitlines() if line.strip()],
                        dtype=np.float64)
    except ValueError:
        raise InputError("rows of unequal length or non-numbers") from None
    if rows.ndim != 2 or rows.shape[1] != 257:
        raise InputError(f"rows of {rows.shape[1:] or '?'} values, expected 257")
    v, labels = rows[:, 1:].astype(np.float32), rows[:, 0]
    if not (np.isin(labels, np.arange(10)).all() and v.min() >= -1 and v.max() <= 1):
        raise InputError("labels outside 0..9 or values outside [-1, 1]")
    return (v + np.float32(1)) / np.float32(2), labels.astype(np.int32)
