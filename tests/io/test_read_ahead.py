"""mrtf.io.read_ahead: the same chunks as the plain loop, bit for bit, from a real HDF5 file;
the reader thread bounded to one chunk ahead and gone after a full pass, an early exit, the
caller's exception or a failed read. Reading ahead is for compute on CUDA: the device named
here is "cuda" (a name only: nothing here touches CUDA)."""

import threading
import time

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

import mrtf.trust.neighbours as tn
from mrtf.compute.backend import Backend
from mrtf.io.hdf5 import ArraySource, H5Dataset, RowSubset, write_dataset
from mrtf.io.read_ahead import plain_chunks, read_ahead, source_chunks

AHEAD = "cuda"


def _readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "mrtf-read-ahead"]


@pytest.fixture(scope="module")
def digits_file(tmp_path_factory):
    """Digits as uint8 pixels (scaled on read) in an HDF5 file."""
    x = (load_digits().images[:, None] * 15.9).astype(np.uint8)
    path = tmp_path_factory.mktemp("h5") / "digits.h5"
    write_dataset(path, x)
    return path


def test_the_same_chunks_as_the_plain_loop(digits_file):
    with H5Dataset(digits_file) as ds:
        want = list(ds.chunks(100))
        seen = []
        for i, (start, x) in enumerate(source_chunks(ds, 100, AHEAD)):
            seen.append(len(_readers()))
            assert start == want[i][0]
            np.testing.assert_array_equal(x, want[i][1])
        assert len(seen) == len(want) == 18 and seen[0] == 1  # read ahead by one thread
        sub = RowSubset(ds, np.arange(3, 1797, 7))
        assert sub.reads_from_disk
        for (s, a), (t, b) in zip(source_chunks(sub, 50, AHEAD), sub.chunks(50), strict=True):
            assert s == t
            np.testing.assert_array_equal(a, b)
    assert _readers() == []


def test_cpu_compute_in_memory_and_single_chunk_sources_are_read_plainly(digits_file):
    x = load_digits().images[:, None].astype(np.float32)
    chunks = source_chunks(ArraySource(x), 100, AHEAD)
    next(chunks)
    assert _readers() == []
    with H5Dataset(digits_file) as ds:
        for plain in (source_chunks(ds, 5000, AHEAD), source_chunks(ds, 100),
                      source_chunks(ds, 100, torch.device("cpu"))):
            next(plain)
            assert _readers() == []


def test_target_neighbourhoods_read_ahead_equal_those_in_memory(digits_file, monkeypatch):
    """A refinery caller, its device path (torch on the CPU here) reading the file ahead as
    it would for CUDA, against the same rows in memory (read plainly)."""
    with H5Dataset(digits_file) as ds:
        in_memory = tn.target_neighbours(ArraySource(ds.read()), k=5, block=256, device="cpu")
        monkeypatch.setattr(tn, "choose_backend",
                            lambda device=None: Backend("torch", torch.device("cpu")))
        threads = []

        def ahead(source, size, device="cpu"):
            for item in source_chunks(source, size, AHEAD):
                threads.append(len(_readers()))
                yield item
        monkeypatch.setattr(tn, "source_chunks", ahead)
        from_disk = tn.target_neighbours(ds, k=5, block=256)
    assert threads == [1] * 8  # every block came through the reader thread
    np.testing.assert_array_equal(from_disk, in_memory)


def _first_of(items):
    for item in items:
        return item


def test_the_reader_stops_on_early_exit(digits_file):
    with H5Dataset(digits_file) as ds:
        assert _first_of(source_chunks(ds, 100, AHEAD))[0] == 0  # return from inside the loop
        assert _readers() == []
        gen = source_chunks(ds, 100, AHEAD)
        next(gen)
        gen.close()
        assert _readers() == []
        with pytest.raises(KeyError):
            for _start, _x in source_chunks(ds, 100, AHEAD):
                raise KeyError("the caller fails")
        assert _readers() == []


class _Counting:
    """A source that counts its reads and fails at row ``fail_at`` (if given)."""

    reads_from_disk = True

    def __init__(self, m: int, fail_at: int | None = None) -> None:
        self.m, self.fail_at, self.reads = m, fail_at, 0

    def __len__(self) -> int:
        return self.m

    def read(self, start: int, stop: int) -> np.ndarray:
        if self.fail_at is not None and start <= self.fail_at < stop:
            raise OSError("corrupt chunk")
        self.reads += 1
        return np.arange(start, min(stop, self.m), dtype=np.float32)


def test_a_failed_read_is_raised_in_order():
    got = []
    with pytest.raises(OSError, match="corrupt chunk"):
        for start, _x in source_chunks(_Counting(100, fail_at=35), 10, AHEAD):
            got.append(start)
    assert got == [0, 10, 20] and _readers() == []


def test_at_most_one_chunk_ahead():
    """After the caller took chunk i, the reader has read at most chunks i + 1 (queued) and
    i + 2 (waiting to be queued)."""
    source = _Counting(200)
    for i, _ in enumerate(source_chunks(source, 10, AHEAD)):
        time.sleep(0.01)  # a slow caller: the reader fills what it may
        assert source.reads <= i + 3
    assert source.reads == 20 and _readers() == []
    assert list(read_ahead(iter(range(7)), depth=3)) == list(range(7))
    assert [s for s, _ in plain_chunks(source, 64)] == [0, 64, 128, 192]
