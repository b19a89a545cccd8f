"""Write-then-rename outputs, so an interrupted run never leaves a half-written file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from mrtf.errors import InputError


def check_output(path: str | os.PathLike, force: bool = False,
                 inputs: tuple[str | os.PathLike, ...] = ()) -> Path:
    """Refuse to overwrite an existing output (unless ``force``) and never overwrite an input."""
    out = Path(path)
    for inp in inputs:
        if inp is not None and Path(inp).exists() and out.exists() and out.samefile(inp):
            raise InputError(f"{out}: output would overwrite an input file")
    if out.exists() and not force:
        raise InputError(f"{out} exists; pass --force to replace it")
    if out.exists() and out.is_dir():
        raise InputError(f"{out} is a directory, not a file")
    if out.parent.exists() and not out.parent.is_dir():
        raise InputError(f"{out.parent}: not a directory")
    return out


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it into place only if the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
