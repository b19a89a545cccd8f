"""Which operations raise a refine's resident memory on a GPU the first time they run (issue
36: the GPU path's peak RSS stays above 2 GiB even on a 20,000-row target, so most of it does
not grow with the data).

CUDA loads a kernel's module lazily, at the first launch of a kernel in it, and keeps the
module's image in host memory. This runs ``mrtf refine`` in this process under a
``TorchDispatchMode`` that reads ``/proc/self/status`` before and after the first call of each
(operator, dtypes, device) and charges the difference to it, with the refinery stage it ran
in. Later calls of the same key are not measured (they load nothing new).

    python bench/gpu_op_memory.py OUT.json -- refine RECEIVED --data T.h5 --labels L.h5 \
        --model M.safetensors --method adaptive --stream on --force --quiet

OUT.json: the stage ends (as stage_memory.py), and every first call with its MB of RssAnon
and RssFile added, largest first. Only the main thread's operations are seen (the reader
threads only read and pin).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from rss_timeline import read_status  # bench/ is this script's directory
from stage_memory import STAGES, status
from torch.utils._python_dispatch import TorchDispatchMode


class FirstCalls(TorchDispatchMode):
    """Charges each new (op, dtypes, devices) key the memory its first call added."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set = set()
        self.rows: list[dict] = []
        self.stage = "start"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        for a in (*args, *kwargs.values()):
            if isinstance(a, (list, tuple)):
                flat += [t for t in a if isinstance(t, torch.Tensor)]
        key = (str(func), tuple(sorted({str(t.dtype) for t in flat})),
               tuple(sorted({t.device.type for t in flat})))
        if key in self.seen:
            return func(*args, **kwargs)
        self.seen.add(key)
        before = read_status(os.getpid())
        out = func(*args, **kwargs)
        after = read_status(os.getpid())
        self.rows.append({"op": key[0], "dtypes": key[1], "devices": key[2],
                          "stage": self.stage,
                          "anon": round(after["RssAnon"] - before["RssAnon"], 1),
                          "file": round(after["RssFile"] - before["RssFile"], 1)})
        return out


def main() -> None:
    out, rest = Path(sys.argv[1]), sys.argv[2:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    import mrtf.refinery.pipeline as pipeline
    from mrtf.cli.main import main as mrtf_main

    mode = FirstCalls()
    ends: list[dict] = []
    t0 = time.perf_counter()

    def wrapped(name, fn):
        def run(*args, **kwargs):
            mode.stage = name
            result = fn(*args, **kwargs)
            ends.append({"stage": name, "s": round(time.perf_counter() - t0, 2), **status()})
            mode.stage = f"after {name}"
            return result
        return run

    for name in STAGES:
        setattr(pipeline, name, wrapped(name, getattr(pipeline, name)))
    sys.argv = ["mrtf", *rest]
    code = 0
    with mode:
        try:
            mrtf_main()
        except SystemExit as e:
            code = e.code or 0
    rows = sorted(mode.rows, key=lambda r: -(r["anon"] + r["file"]))
    by_stage: dict[str, float] = {}
    for r in rows:
        by_stage[r["stage"]] = round(by_stage.get(r["stage"], 0.0) + r["anon"], 1)
    out.write_text(json.dumps({"stage_ends": ends, "first_calls_anon_by_stage": by_stage,
                               "first_calls": rows}, indent=1))
    print("first calls' anon MB by stage:", by_stage, file=sys.stderr)
    for r in rows[:25]:
        print(f"  {r['anon']:7.1f} anon {r['file']:6.1f} file  {r['stage']:16s} {r['op']} "
              f"{r['dtypes']} {r['devices']}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
