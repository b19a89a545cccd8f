"""The command's C allocator: at most two glibc malloc arenas (issue 36, host memory).

glibc gives each thread that allocates its own arena, up to eight per core, and an arena keeps
what its thread freed for reuse. A refine on a GPU machine runs many threads (PyTorch's
intra-op pool, the CUDA runtime's, the HDF5 reader), so the freed memory of each stays in the
resident set: on an H200 the 1M-row refine's peak was lower with two arenas
(docs/benchmarks/gpu.md, "Host memory"); with a CPU refine's few threads there are few
arenas anyway.

``mrtf`` calls :func:`limit_malloc_arenas` once, first thing (cli/main.py); a library user's
process is left as it is. A ``MALLOC_ARENA_MAX`` in the environment wins: glibc read it at
start, and it is not overridden.
"""

from __future__ import annotations

import ctypes
import os
import platform

#: arenas the command allows (glibc's MALLOC_ARENA_MAX)
ARENAS = 2
#: mallopt's parameter number for the arena limit (glibc malloc.h: M_ARENA_MAX)
M_ARENA_MAX = -8


def _libc() -> ctypes.CDLL | None:
    """glibc's C library, or None where the C library is another (musl, macOS, Windows)."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Let glibc create at most ``arenas`` malloc arenas from now on (threads that already
    allocated keep theirs). True when the limit was set; False without glibc, or when the
    environment sets MALLOC_ARENA_MAX."""
    if arenas < 1:
        raise ValueError(f"arenas must be >= 1, got {arenas}")
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, arenas))
