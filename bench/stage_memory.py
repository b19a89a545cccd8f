"""Run the ``mrtf`` command with the resident memory read after each refinery stage, and
optionally glibc's ``malloc_trim(0)`` called there (issue 36: where the GPU path's peak RSS
builds up, and whether memory freed by a stage but kept by the allocator is part of it).

    python bench/stage_memory.py OUT.json [--trim] -- refine RECEIVED --data ... [mrtf args]

OUT.json gets one row per stage end (teachers, evidence, targets, fit, report): the seconds
since start and ``/proc/self/status``'s fields of rss_timeline.FIELDS in MB (after the trim,
with --trim). The stages are wrapped, not changed: the labels are the same.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path

from rss_timeline import read_status  # bench/ is this script's directory

STAGES = ("teach", "gather_evidence", "make_targets", "fit", "report")


def status() -> dict[str, float]:
    """This process's rss_timeline.FIELDS in MB, to 0.1 MB."""
    return {k: round(v, 1) for k, v in (read_status(os.getpid()) or {}).items()}


def wrap(pipeline, rows: list[dict], trim) -> None:
    """Each stage function of ``pipeline`` reads the memory when it returns (and trims)."""
    t0 = time.perf_counter()

    def wrapped(name, fn):
        def run(*args, **kwargs):
            out = fn(*args, **kwargs)
            if trim is not None:
                trim(0)
            rows.append({"stage": name, "s": round(time.perf_counter() - t0, 2), **status()})
            return out
        return run

    for name in STAGES:
        setattr(pipeline, name, wrapped(name, getattr(pipeline, name)))


def main() -> None:
    out, rest = Path(sys.argv[1]), sys.argv[2:]
    trim = None
    if rest and rest[0] == "--trim":
        trim, rest = ctypes.CDLL("libc.so.6").malloc_trim, rest[1:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    import mrtf.refinery.pipeline as pipeline
    from mrtf.cli.main import main as mrtf_main

    rows: list[dict] = []
    wrap(pipeline, rows, trim)
    sys.argv = ["mrtf", *rest]
    try:
        mrtf_main()
    finally:
        out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
