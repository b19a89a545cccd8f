"""mrtf/host_memory.py: the command's glibc arena limit (issue 36, host memory on a GPU)."""

import platform
import subprocess
import sys
import textwrap

import pytest

from mrtf import host_memory

GLIBC = platform.libc_ver()[0] == "glibc"

# threads that allocate at the same time, then glibc's own account of its arenas
COUNT_ARENAS = textwrap.dedent("""
    import ctypes, os, re, sys, tempfile, threading
    from mrtf.host_memory import limit_malloc_arenas
    limited = limit_malloc_arenas() if sys.argv[1] == "limit" else None
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    gate = threading.Barrier(6)
    def work():
        p = libc.malloc(4096)  # each thread's first malloc takes or makes an arena
        gate.wait()  # all six hold one at once: none is free to be reused
        libc.free(p)
    threads = [threading.Thread(target=work) for _ in range(6)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    fd, path = tempfile.mkstemp()
    fp = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    print(limited, len(re.findall("<heap nr=", open(path).read())))
    os.close(fd)
    os.unlink(path)
""")


def _arenas(mode: str, env: dict | None = None) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", COUNT_ARENAS, mode], capture_output=True,
                         text=True, check=True, env=env, timeout=60).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not GLIBC, reason="the arena limit is glibc's")
def test_the_limit_caps_the_arenas_of_threads_that_allocate_at_once():
    limited, capped = _arenas("limit")
    free, default = _arenas("plain")
    assert limited == "True" and capped <= host_memory.ARENAS
    assert default > host_memory.ARENAS  # six threads at once get arenas of their own


@pytest.mark.skipif(not GLIBC, reason="the arena limit is glibc's")
def test_the_environment_wins(monkeypatch):
    import os

    env = {**os.environ, "MALLOC_ARENA_MAX": "3"}
    limited, arenas = _arenas("limit", env)
    assert limited == "False" and arenas <= 3


def test_without_glibc_nothing_is_set(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setattr(host_memory, "_libc", lambda: None)
    assert host_memory.limit_malloc_arenas() is False


def test_the_limit_is_checked():
    with pytest.raises(ValueError, match="arenas"):
        host_memory.limit_malloc_arenas(0)
