"""A child process's resident memory over time, and what it is made of (issue 36: the GPU
path's peak RSS).

``ru_maxrss`` gives the peak alone. Sampling ``/proc/PID/status`` also gives its parts: the
process's own arrays (``RssAnon``), mapped files such as the CUDA libraries (``RssFile``),
shared memory, and locked or pinned pages (``VmLck``, ``VmPin``: pinned host buffers). With the
time of each sample, a peak can be pinned on a stage of the run and on a kind of memory.

    from rss_timeline import run_sampled
    done = run_sampled(["mrtf", "refine", ...], env)   # done.peak, done.timeline
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field

#: the /proc/PID/status lines read, in MB
FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmLck", "VmPin", "VmHWM")


def read_status(pid: int) -> dict[str, float] | None:
    """The FIELDS of ``/proc/PID/status`` in MB, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in FIELDS:
            out[name] = int(value.split()[0]) / 1024  # kB
    return out


@dataclass
class Sampled:
    """A finished child: its exit code and output, its memory samples (seconds since start,
    FIELDS) kept where VmRSS moved by at least ``step`` MB, and the sample of its largest
    VmRSS."""

    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    timeline: list[dict] = field(default_factory=list)
    peak: dict = field(default_factory=dict)


def run_sampled(cmd: list[str], env: dict[str, str], interval: float = 0.05,
                step: float = 16.0) -> Sampled:
    """Run ``cmd`` with ``env`` and sample its memory every ``interval`` seconds until it
    exits."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    timeline: list[dict] = []
    peak: dict = {}
    stop = threading.Event()

    def sample() -> None:
        last = -step
        while not stop.is_set():
            now = read_status(proc.pid)
            if now is None:
                return
            now["t"] = round(time.perf_counter() - t0, 2)
            if now.get("VmRSS", 0) >= peak.get("VmRSS", 0):
                peak.clear()
                peak.update(now)
            if abs(now.get("VmRSS", 0) - last) >= step:
                timeline.append(now)
                last = now.get("VmRSS", 0)
            stop.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    stop.set()
    sampler.join()
    return Sampled(proc.returncode, out, err, time.perf_counter() - t0, timeline, dict(peak))
