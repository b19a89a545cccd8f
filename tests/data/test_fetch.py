"""``mrtf data fetch`` for real over HTTP: a loopback server on 127.0.0.1 serving
../shared/data (a good fetch, a wrong checksum, a cut connection resumed with Range, a server
that ignores Range, a stalled server, USPS rebuilt from ESL-format files)."""

from __future__ import annotations

import fcntl
import gzip
import io
import json
import re
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from mrtf.cli.main import cli
from mrtf.data import fetch as fetch_module
from mrtf.data import load_standard
from mrtf.data.fetch import FetchOptions, fetch_dataset
from mrtf.data.registry import file_digest
from mrtf.errors import InputError

FAST = FetchOptions(timeout=5.0, retries=0, backoff=0.0)


class Handler(BaseHTTPRequestHandler):
    """GET of files under ``server.root``; Range only when ``server.ranges``; a path in
    ``server.cut`` is sent half-way once, then the connection is closed."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        srv = self.server
        srv.log.append((self.path, self.headers.get("Range")))
        if srv.stall:
            time.sleep(srv.stall)
        path = srv.root / self.path.lstrip("/")
        if ".." in self.path or not path.is_file():
            self.send_error(404)
            return
        data, start = path.read_bytes(), 0
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if match and srv.ranges:
            start = int(match.group(1))
            if start >= len(data):
                self.send_error(416)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        body = data[start:]
        if self.path in srv.cut:
            srv.cut.discard(self.path)
            body = body[:len(body) // 2]
        srv.sent.append((self.path, start, len(body)))
        self.wfile.write(body)
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server(shared_data):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.root, srv.ranges, srv.cut, srv.stall = shared_data, True, set(), 0.0
    srv.log, srv.sent = [], []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(5)


def run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_good_fetch_verified_then_listed_and_loaded(server, tmp_path, shared_data):
    res = run("data", "fetch", "mnist", "--data-dir", tmp_path, "--mirror", server.url)
    assert res.exit_code == 0, res.output
    assert res.output.count("downloaded") == 4 and "verified in" in res.output
    for name in ("t10k-images-idx3-ubyte.gz", "train-images-idx3-ubyte.gz"):
        assert file_digest(tmp_path / "mnist" / name) == file_digest(shared_data / "mnist" / name)
    assert not list(tmp_path.rglob("*.part"))
    assert load_standard("mnist", data_dir=tmp_path).x.shape == (10000, 1, 28, 28)
    res = run("data", "list", "--data-dir", tmp_path, "--json")
    states = [f["state"] for f in json.loads(res.output)["files"]]
    assert states == ["verified"] * 4 + ["missing"] * 2
    requests = len(server.log)
    res = run("data", "fetch", "mnist", "--data-dir", tmp_path, "--mirror", server.url)
    assert res.output.count("present") == 4 and len(server.log) == requests  # nothing fetched


def test_wrong_checksum_is_not_kept(server, tmp_path):
    (tmp_path / "srv/mnist_m").mkdir(parents=True)
    (tmp_path / "srv/mnist_m/mnist_m_test.npz").write_bytes(b"\0not the file" * 1000)
    server.root = tmp_path / "srv"
    res = run("data", "fetch", "mnistm", "--data-dir", tmp_path / "d", "--mirror", server.url)
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and "failed its check and was not kept" in res.output
    assert not list((tmp_path / "d").rglob("*.npz*"))


def test_cut_connection_then_resumed_with_range(server, tmp_path, shared_data):
    server.cut.add("/usps/usps.h5")
    res = run("data", "fetch", "usps", "--data-dir", tmp_path, "--mirror", server.url,
              "--retries", "0")
    assert res.exit_code == 2 and "connection closed after" in res.output
    size = (shared_data / "usps/usps.h5").stat().st_size
    part = tmp_path / "usps/usps.h5.part"
    assert part.stat().st_size == size // 2 and "to resume" in res.output
    res = run("data", "fetch", "usps", "--data-dir", tmp_path, "--mirror", server.url)
    assert res.exit_code == 0, res.output
    assert server.log[-1] == ("/usps/usps.h5", f"bytes={size // 2}-")
    assert server.sent[-1] == ("/usps/usps.h5", size // 2, size - size // 2)  # only the rest
    assert file_digest(tmp_path / "usps/usps.h5") == file_digest(shared_data / "usps/usps.h5")
    assert not part.exists()


def test_retry_resumes_within_one_fetch(server, tmp_path):
    server.cut.add("/usps/usps.h5")
    got = fetch_dataset("usps", tmp_path, server.url, FetchOptions(retries=1, backoff=0.0))
    assert got[0].status == "downloaded" and len(server.log) == 2
    assert server.log[1][1] is not None and server.sent[1][1] > 0


def test_server_without_range_restarts_from_zero(server, tmp_path, shared_data):
    data = (shared_data / "usps/usps.h5").read_bytes()
    (tmp_path / "usps").mkdir()
    (tmp_path / "usps/usps.h5.part").write_bytes(data[:1000])
    server.ranges = False
    fetch_dataset("usps", tmp_path, server.url, FAST)
    assert server.log == [("/usps/usps.h5", "bytes=1000-")]
    assert server.sent == [("/usps/usps.h5", 0, len(data))]
    assert (tmp_path / "usps/usps.h5").read_bytes() == data


def test_stalled_server_times_out_with_one_line(server, tmp_path):
    server.stall = 1.5
    with pytest.raises(InputError, match="download failed .*timed out"):
        fetch_dataset("usps", tmp_path, server.url, FetchOptions(timeout=0.3, retries=0))


def test_official_sources_in_order_and_bad_copy_replaced(server, tmp_path, monkeypatch):
    """A source that answers 404 is skipped for the next one; a bad file is replaced."""
    specs = fetch_module.files_of("mnist")[2:]  # the test split
    moved = [s.__class__(**{**s.__dict__, "urls": (f"{server.url}/gone/{s.path}",
                                                   f"{server.url}/{s.path}")}) for s in specs]
    monkeypatch.setattr(fetch_module, "files_of", lambda name: tuple(moved))
    (tmp_path / "mnist").mkdir()
    (tmp_path / specs[1].path).write_bytes(gzip.compress(b"bad"))
    got = fetch_dataset("mnist", tmp_path, None, FAST)
    assert [f.status for f in got] == ["downloaded", "downloaded"]
    assert [p for p, _ in server.log] == [f"/gone/{specs[0].path}", f"/{specs[0].path}",
                                          f"/gone/{specs[1].path}", f"/{specs[1].path}"]
    assert np.bincount(load_standard("mnist", data_dir=tmp_path).y)[0] == 980


def _esl_text(x: np.ndarray, y: np.ndarray) -> bytes:
    """ESL's format: the label, then the 256 pixels scaled to [-1, 1], 3 decimals."""
    v = np.round(2.0 * x.astype(np.float64) - 1.0, 3)
    text = io.BytesIO()
    np.savetxt(text, np.column_stack([y, v]), fmt="%.4f")
    return gzip.compress(text.getvalue(), compresslevel=1, mtime=0)


def test_usps_rebuilt_from_esl_files(server, tmp_path, shared_data, monkeypatch):
    (tmp_path / "srv").mkdir()
    with h5py.File(shared_data / "usps/usps.h5") as fh:
        for split in ("train", "test"):
            text = _esl_text(fh[f"{split}/data"][()], fh[f"{split}/target"][()])
            (tmp_path / f"srv/zip.{split}.gz").write_bytes(text)
    server.root = tmp_path / "srv"
    monkeypatch.setattr(fetch_module, "USPS_ESL_URLS",
                        {s: (f"{server.url}/zip.{s}.gz",) for s in ("train", "test")})
    got = fetch_dataset("usps", tmp_path / "d", None, FAST)
    assert got[0].status == "converted" and not list((tmp_path / "d").rglob("*.part"))
    ours = load_standard("usps", "train", data_dir=tmp_path / "d")
    theirs = load_standard("usps", "train", data_dir=shared_data)
    assert np.array_equal(ours.x, theirs.x) and np.array_equal(ours.y, theirs.y)


def test_mnistm_needs_a_mirror_and_mirror_must_be_a_url(tmp_path):
    res = run("data", "fetch", "mnistm", "--data-dir", tmp_path)
    assert res.exit_code == 2 and "no official single-file download" in res.output
    res = run("data", "fetch", "usps", "--data-dir", tmp_path, "--mirror", "ftp://x")
    assert res.exit_code == 2 and "http://" in res.output
    res = run("data", "fetch", "svhn", "--data-dir", tmp_path)
    assert res.exit_code == 2 and "unknown dataset 'svhn'" in res.output
    assert run("data", "path", "--data-dir", tmp_path).output.strip() == str(tmp_path)


def test_copied_files_verify_in_place(tmp_path, shared_data):
    shutil.copytree(shared_data / "usps", tmp_path / "usps")
    assert fetch_dataset("usps", tmp_path, None, FAST)[0].status == "present"


def test_a_second_fetch_of_the_same_file_is_refused(server, tmp_path):
    (tmp_path / "usps").mkdir()
    part = tmp_path / "usps/usps.h5.part"
    with open(part, "wb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(InputError, match="another mrtf data fetch is downloading"):
            fetch_dataset("usps", tmp_path, server.url, FAST)
    assert server.log == []
