"""Outputs under hostile conditions (issue 11): a locked, read-only or full destination, a
write that fails half-way, SIGTERM/SIGINT/SIGKILL during a run, the umask, a simulate run
directory with stray temporary files. Same contract as tests/test_hostile_inputs.py: one line
on stderr, exit code 2 (130/143 for signals), nothing left behind."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hostile_files import assert_refused, label_args, make_base, refine_args, snapshot

from mrtf.cli.main import cli


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_base(tmp_path_factory.mktemp("hostile-base"))


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
    import mrtf.jobs.refine as refine_mod

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
