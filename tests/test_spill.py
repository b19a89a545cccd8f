"""Scratch arrays of the streaming refinery (spill.py) and the helpers it leans on."""

import numpy as np
import pytest

from mrtf.refinery.prefetch import prefetched
from mrtf.refinery.spill import Scratch, TeacherMajor
from mrtf.refinery.teachers import global_stds


def test_spill_round_trip_and_cleanup(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1000, 3, 4)).astype(np.float32)
    with Scratch(tmp_path) as sc:
        a = sc.array("x", x.shape)
        for s in range(0, 1000, 300):
            a.write(s, x[s:s + 300])
        np.testing.assert_array_equal(a[:], x)
        np.testing.assert_array_equal(a[250:777], x[250:777])
        rows = np.array([0, 5, 299, 300, 999])
        np.testing.assert_array_equal(a.take(rows, block=128), x[rows])
        t = TeacherMajor(a)
        assert t.shape == (3, 1000, 4)
        want = np.ascontiguousarray(x.transpose(1, 0, 2))
        np.testing.assert_array_equal(t[:, 10:20], want[:, 10:20])
        np.testing.assert_array_equal(t[:2, 10:20], want[:2, 10:20])
        assert t[:, 10:20].flags.c_contiguous
        assert len(list(tmp_path.iterdir())) == 1
    assert list(tmp_path.iterdir()) == []


def test_scratch_removed_on_error(tmp_path):
    with pytest.raises(KeyboardInterrupt), Scratch(tmp_path) as sc:
        sc.array("x", (10, 2)).write(0, np.ones((10, 2)))
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_global_stds_block_independent():
    rng = np.random.default_rng(1)
    lg = (rng.normal(size=(3, 1001, 7)) * [[[1.0]], [[5.0]], [[0.1]]]).astype(np.float32)
    want = [lg[k].astype(np.float64).std() for k in range(3)]
    np.testing.assert_allclose(global_stds(lg, block=100), want, rtol=1e-12)
    np.testing.assert_array_equal(global_stds(lg, block=100), global_stds(lg, block=100))


def test_prefetched_keeps_order_and_raises():
    assert list(prefetched(iter(range(50)))) == list(range(50))

    def broken():
        yield 1
        raise ValueError("bad chunk")

    got = []
    with pytest.raises(ValueError, match="bad chunk"):
        for item in prefetched(broken()):
            got.append(item)
    assert got == [1]
    gen = prefetched(iter(range(1000)))
    assert next(gen) == 0
    gen.close()  # the reader thread stops and is joined


def test_stale_scratch_of_a_killed_run_is_removed_live_one_kept(tmp_path):
    stale = tmp_path / ".mrtf-scratch-deadbeef"
    stale.mkdir()
    (stale / "logits.bin").write_bytes(b"x" * 10)
    with Scratch(tmp_path) as live:
        assert not stale.exists()
        with Scratch(tmp_path) as other:  # a second run beside it: the first is locked
            assert live.dir.exists() and other.dir != live.dir
        assert live.dir.exists()
    assert list(tmp_path.iterdir()) == []
