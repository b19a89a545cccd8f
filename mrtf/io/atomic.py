"""Write-then-rename outputs, so an interrupted run never leaves a half-written file.

Temporary files are named ``.NAME.XXXXXXXX.tmp`` beside the target, with NAME cut to 200
characters so that the temporary name fits the file system's 255 even for a long target name.
They are created with the mode a plain ``open()`` would give (0666 minus the umask), not
``mkstemp``'s 0600.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from mrtf.errors import InputError, OutputError

_STEM = 200


def temp_stem(target: Path) -> str:
    return target.name[:_STEM]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def make_temp(target: Path) -> Path:
    """Create (O_EXCL) an empty temporary file beside ``target``; OSError when impossible."""
    fd, tmp = tempfile.mkstemp(prefix=f".{temp_stem(target)}.", suffix=".tmp",
                               dir=target.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
    finally:
        os.close(fd)
    return Path(tmp)


def stale_temps(target: Path) -> list[Path]:
    """Temporary files of earlier writes of ``target`` (call only while holding its lock)."""
    pattern = re.compile(rf"\.{re.escape(temp_stem(target))}\.[a-z0-9_]{{8}}\.tmp")
    try:
        names = os.listdir(target.parent)
    except OSError:
        return []
    return [target.parent / n for n in names if pattern.fullmatch(n)]


def is_temp_name(name: str) -> bool:
    """Whether ``name`` looks like one of our temporary files."""
    return bool(re.fullmatch(r"\..+\.[a-z0-9_]{8}\.tmp", name))


def check_output(path: str | os.PathLike, force: bool = False,
                 inputs: tuple[str | os.PathLike, ...] = ()) -> Path:
    """Refuse to overwrite an existing output (unless ``force``) and never overwrite an input."""
    out = Path(path)
    check_distinct([out], [Path(i) for i in inputs if i is not None], force)
    if out.parent.exists() and not out.parent.is_dir():
        raise InputError(f"{out.parent}: not a directory")
    return out


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, atomic: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it into place only if the block succeeds.

    ``atomic=False`` yields ``path`` itself: the caller already writes to a temporary file
    (an :class:`mrtf.io.outputs.Outputs` unit renames it later).
    """
    target = Path(path)
    if not atomic:
        yield target
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = make_temp(target)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def check_distinct(targets: Sequence[Path], inputs: Sequence[Path], force: bool) -> None:
    """No output is an input or another output; existing outputs need ``force``."""
    seen: dict[Path, Path] = {}
    for out in targets:
        key = _canonical(out)
        if key in seen:
            raise OutputError(f"{out}: given as two outputs ({seen[key]} and {out}); one "
                              "would overwrite the other")
        seen[key] = out
        for inp in inputs:
            if key == _canonical(inp) or (_exists(out) and _exists(inp) and _same(out, inp)):
                raise OutputError(f"{out}: output would overwrite an input file")
        if _exists(out):
            if out.is_dir():
                raise OutputError(f"{out} is a directory, not a file")
            if not force:
                raise OutputError(f"{out} exists; pass --force to replace it")


def _exists(p: Path) -> bool:
    """Whether anything (a dangling link too) is at ``p``; False for an impossible name."""
    try:
        os.lstat(p)
    except (OSError, ValueError):
        return False
    return True


def _canonical(p: Path) -> Path:
    try:
        return p.resolve()
    except (OSError, RuntimeError):
        return p.absolute()


def _same(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return False
