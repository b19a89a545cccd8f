"""All outputs of one command as one unit: checked and claimed before the heavy work, written
to temporary files beside their targets, renamed into place together at the end.

``Outputs`` is what ``refine``, ``label`` and ``convert`` use:

- before any computation, each output is checked (not an input, not another output, not an
  existing file without ``--force``, its folder creatable and writable, its name not too long),
  locked for this run (``fcntl.flock`` on a hidden ``.NAME.lock`` file beside it, so a second
  run on the same output is refused at once), and its temporary file is created (which proves
  the folder is writable and the name fits);
- stale temporary files of a killed earlier run on that output are removed (the lock proves
  no live run owns them);
- the outputs are renamed into place together, with SIGINT and SIGTERM blocked for those few
  renames; on any failure before that, every temporary file, lock file and folder this run
  created is removed, so a failed or interrupted command leaves nothing behind.

A write failure (disk full, quota, file too large) becomes :class:`OutputError`, one line.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path

from mrtf.errors import OutputError
from mrtf.io.atomic import check_distinct, make_temp, stale_temps, temp_stem
from mrtf.io.limits import human_bytes

_BLOCKED = {signal.SIGINT, signal.SIGTERM}


class Outputs:
    """The outputs of one command. Use as a context manager around the whole command."""

    def __init__(self, paths: Sequence[str | os.PathLike | None], force: bool = False,
                 inputs: Sequence[str | os.PathLike | None] = ()) -> None:
        self.targets = [Path(p) for p in paths if p is not None]
        self.force = force
        self.inputs = [Path(p) for p in inputs if p is not None]
        self._tmp: dict[Path, Path] = {}
        self._locks: list[tuple[Path, int]] = []
        self._made_dirs: list[Path] = []
        self.committed = False

    # -------------------------------------------------------------- before the heavy work

    def __enter__(self) -> Outputs:
        check_distinct(self.targets, self.inputs, self.force)
        try:
            for target in self.targets:
                self._claim(target)
        except BaseException:
            self._cleanup()
            raise
        return self

    def _claim(self, target: Path) -> None:
        self._make_parent(target.parent)
        try:  # the final rename would fail on a name the file system cannot hold
            limit = os.pathconf(target.parent, "PC_NAME_MAX")
        except (OSError, ValueError):
            limit = 255
        if len(os.fsencode(target.name)) > limit:
            raise OutputError(f"{target.name[:40]}...: file name too long "
                              f"({len(os.fsencode(target.name))} bytes, at most {limit} here)")
        self._lock(target)
        for stale in stale_temps(target):
            stale.unlink(missing_ok=True)
        try:
            self._tmp[target] = make_temp(target)
        except OSError as exc:
            raise OutputError(f"{target}: cannot write here ({exc.strerror})") from None

    def _make_parent(self, parent: Path) -> None:
        missing = []
        p = parent
        while not p.exists() and not p.is_symlink() and p != p.parent:
            missing.append(p)
            p = p.parent
        if p.exists() and not p.is_dir():
            raise OutputError(f"{p}: not a directory, cannot hold an output")
        for d in reversed(missing):
            try:
                d.mkdir()
            except FileExistsError:
                continue
            except OSError as exc:
                raise OutputError(f"{d}: cannot create the output folder ({exc.strerror})"
                                  ) from None
            self._made_dirs.append(d)

    def _lock(self, target: Path) -> None:
        lock = target.parent / f".{temp_stem(target)}.lock"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise OutputError(f"{target}: cannot write here ({exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # the lock file may have been removed and re-created by a run that just ended:
            # then this lock guards nothing and another run may hold the new file's lock
            if os.fstat(fd).st_ino != os.stat(lock).st_ino:
                raise BlockingIOError
        except (BlockingIOError, FileNotFoundError):
            os.close(fd)
            raise OutputError(f"{target}: another mrtf run is writing this output now"
                              ) from None
        self._locks.append((lock, fd))

    def check_space(self, needed: dict[Path, int]) -> None:
        """Refuse before the heavy work when a folder lacks room for the estimated bytes."""
        by_dev: dict[int, tuple[Path, int]] = {}
        for target, size in needed.items():
            dev = os.stat(target.parent).st_dev
            where, total = by_dev.get(dev, (target.parent, 0))
            by_dev[dev] = (where, total + size)
        for where, total in by_dev.values():
            free = shutil.disk_usage(where).free
            if free < total:
                raise OutputError(f"{where}: {human_bytes(free)} free, the outputs need about "
                                  f"{human_bytes(total)}")

    # -------------------------------------------------------------- writing and committing

    @contextlib.contextmanager
    def writing(self, target: str | os.PathLike) -> Iterator[Path]:
        """The temporary path to write ``target``'s content to; write errors become one line."""
        target = Path(target)
        try:
            yield self._tmp[target]
        except OSError as exc:
            raise OutputError(f"{target}: write failed ({exc.strerror or exc})") from None
        except RuntimeError as exc:
            # HDF5 reports a failed write(2) on flush/close as a RuntimeError that quotes the
            # system's message; anything else is not a write failure and stays a bug
            found = re.search(r"error message = '([^']*)'", str(exc))
            if found is None:
                raise
            raise OutputError(f"{target}: write failed ({found.group(1)})") from None

    def commit(self) -> None:
        """Rename every output into place, with SIGINT/SIGTERM held off meanwhile."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
        done: list[Path] = []
        try:
            for target, tmp in self._tmp.items():
                try:
                    os.replace(tmp, target)
                except OSError as exc:
                    for d in done:  # all or none: take back what this run put in place
                        d.unlink(missing_ok=True)
                    raise OutputError(f"{target}: cannot put the output in place "
                                      f"({exc.strerror})") from None
                done.append(target)
            self.committed = True
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def __exit__(self, *exc: object) -> None:
        self._cleanup()

    def _cleanup(self) -> None:
        if not self.committed:
            for tmp in self._tmp.values():
                tmp.unlink(missing_ok=True)
        for lock, fd in self._locks:
            with contextlib.suppress(OSError):
                lock.unlink()
            os.close(fd)
        self._locks.clear()
        if not self.committed:
            for d in reversed(self._made_dirs):
                with contextlib.suppress(OSError):
                    d.rmdir()  # only if still empty


RUN_LOCK = ".mrtf-run.lock"


@contextlib.contextmanager
def locked_dir(directory: Path) -> Iterator[None]:
    """Hold ``flock`` on ``DIR/.mrtf-run.lock`` for the block: one process writes a run
    directory at a time (a second ``--resume`` of a running run is refused at once). The lock
    file stays: removing it would let a third process lock a new file while the second still
    holds the old one."""
    lock = directory / RUN_LOCK
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise OutputError(f"{directory}: cannot write here ({exc.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputError(f"{directory}: another mrtf run is writing this run directory "
                              "now; wait for it to end, or choose another --out") from None
        yield
    finally:
        os.close(fd)
