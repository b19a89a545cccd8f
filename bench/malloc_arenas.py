"""Run an ``mrtf`` command in this process and print, at its end, how many glibc malloc arenas
exist, the threads and the peak resident set (issue 36: the command's arena limit, checked
against the environment variable).

    python bench/malloc_arenas.py [--limit] -- refine RECEIVED --data T.h5 ...
    MALLOC_ARENA_MAX=2 python bench/malloc_arenas.py -- refine ...

``--limit`` sets the limit where ``mrtf``'s own entry point does (mrtf.host_memory, after the
imports); without it the command runs with glibc's default (or the variable).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import tempfile

from rss_timeline import read_status  # bench/ is this script's directory


def arenas() -> int:
    """glibc's heaps in ``malloc_info``: one per arena."""
    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    fd, path = tempfile.mkstemp()
    try:
        fp = libc.fopen(path.encode(), b"w")
        libc.malloc_info(0, fp)
        libc.fclose(fp)
        return len(re.findall("<heap nr=", open(path).read()))
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> None:
    args = sys.argv[1:]
    limit = bool(args) and args[0] == "--limit"
    args = args[1:] if limit else args
    args = args[1:] if args and args[0] == "--" else args
    from mrtf.cli.main import cli
    from mrtf.host_memory import limit_malloc_arenas

    if limit:
        limit_malloc_arenas()
    sys.argv = ["mrtf", *args]
    try:
        cli(prog_name="mrtf", standalone_mode=False)
    finally:  # printed to a file: the command may have closed or redirected stderr
        st = read_status(os.getpid()) or {}
        line = (f"arenas {arenas()} threads {len(os.listdir('/proc/self/task'))} "
                f"peak RSS {st.get('VmHWM', float('nan')):.0f} MB")
        with open(os.environ.get("ARENAS_OUT", "/dev/stdout"), "a") as f:
            print(line, file=f)


if __name__ == "__main__":
    main()
