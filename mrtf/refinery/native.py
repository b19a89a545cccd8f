"""The compiled LeNet kernel (lenet_kernel.c): built with the system C compiler at first use,
cached per user, loaded with ctypes; None wherever it cannot be (no compiler, no AVX-512, not
x86-64, ``MRTF_NATIVE=0``), and stacked.py then uses oneDNN.

Why compile at run time rather than ship a binary: the package stays pure Python (one wheel
for every platform), and the kernel is built with ``-march=native`` for the CPU it runs on.
The cache key holds the source, the compiler, the flags and the CPU's model and flags, so a
home directory shared between different machines never loads a library built for another CPU.
The build takes ~0.2 s; it is written under a temporary name and renamed, so two processes
building at once both end with a whole file.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

FLAGS = ("-O3", "-march=native", "-fPIC", "-shared")
CHANNELS = 16  # the zoo LeNet's conv widths, one AVX-512 vector
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}


@functools.cache  # read once per process: library() is asked for every teacher group
def _cpu_id() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    keep = [s for s in lines if s.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(keep))  # one copy per distinct line (one per core)


def cache_dir() -> Path:
    """``$MRTF_CACHE`` or ``$XDG_CACHE_HOME/mrtf`` (``~/.cache/mrtf``), ``kernels/`` under it."""
    root = os.environ.get("MRTF_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mrtf")
    return Path(root) / "kernels"


def _build(src: Path, cc: str, out: Path) -> bool:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *FLAGS, "-o", tmp, str(src)], capture_output=True,
                              timeout=120)
        if done.returncode != 0:
            return False
        os.replace(tmp, out)
        return True
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def library() -> ctypes.CDLL | None:
    """The built kernel, or None (see the module docstring); built once per cache key."""
    if os.environ.get("MRTF_NATIVE", "1") == "0" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        return None
    src = resources.files("mrtf.refinery").joinpath("lenet_kernel.c")
    with resources.as_file(src) as path:
        key = hashlib.sha256(b"\0".join([path.read_bytes(), cc.encode(), " ".join(FLAGS).encode(),
                                         _cpu_id().encode()])).hexdigest()[:20]
        with _lock:
            if key not in _loaded:
                so = cache_dir() / f"lenet-{key}.so"
                try:
                    ok = so.exists() or _build(path, cc, so)
                    _loaded[key] = _declare(ctypes.CDLL(str(so))) if ok else None
                except OSError:  # an unwritable cache, a library that does not load
                    _loaded[key] = None
            return _loaded[key]


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.mrtf_lenet_features.argtypes = [p, i, i, i, i, p, p, p, p, i, i, p, p]
    lib.mrtf_lenet_features.restype = i
    return lib


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """The kernel reads weights and writes outputs as 64-byte vectors."""
    assert t.is_contiguous() and t.data_ptr() % 64 == 0, "kernel arrays must be 64-byte aligned"
    return t


def native_features(models: Sequence[nn.Module]
                    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``x (B, C, H, W) -> (B, K, D)`` post-ReLU conv features in (h, w, c) order for K zoo
    LeNets (eligible per stacked.eligible, 5×5 kernels, 16 channels), or None without the
    kernel. Images are split between ``torch.get_num_threads()`` threads (ctypes lets go of
    the GIL)."""
    lib = library()
    c1, c2 = models[0].body[0], models[0].body[3]
    shapes = (c1.kernel_size, c2.kernel_size, c1.out_channels, c2.in_channels, c2.out_channels)
    if lib is None or c1.weight.device.type != "cpu" or \
            shapes != ((5, 5), (5, 5), CHANNELS, CHANNELS, CHANNELS) or \
            c1.padding[0] != c1.padding[1] or c2.padding[0] != c2.padding[1]:
        return None
    k, cin, pad1, pad2 = len(models), c1.in_channels, c1.padding[0], c2.padding[0]
    w1 = _aligned(torch.stack([m.body[0].weight.detach().permute(1, 2, 3, 0) for m in models])
                  .contiguous())  # (K, cin, 5, 5, co)
    w2 = _aligned(torch.stack([m.body[3].weight.detach().permute(2, 3, 1, 0) for m in models])
                  .contiguous())  # (K, kh, kw, ci, co)
    b1 = _aligned(torch.stack([m.body[0].bias.detach() for m in models]).contiguous())
    b2 = _aligned(torch.stack([m.body[3].bias.detach() for m in models]).contiguous())

    def part(x: torch.Tensor, out: torch.Tensor) -> None:
        _, _, h, w = x.shape
        p = ((h - 4) // 2 + 2 * pad2) * ((w - 4) // 2 + 2 * pad2)
        scratch = _aligned(torch.empty(p * CHANNELS))
        rc = lib.mrtf_lenet_features(x.data_ptr(), len(x), cin, h, w, w1.data_ptr(),
                                     b1.data_ptr(), w2.data_ptr(), b2.data_ptr(), k, pad2,
                                     scratch.data_ptr(), _aligned(out).data_ptr())
        assert rc == 0, "map sizes are checked before the call"

    def run(x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":  # the kernel reads host memory
            raise ValueError(f"the LeNet kernel runs on CPU tensors, got {x.device}")
        x = x.float()
        if pad1:
            x = F.pad(x, (pad1,) * 4)
        x = x.contiguous()
        _, _, h, w = x.shape
        qh, qw = ((h - 4) // 2 + 2 * pad2 - 4) // 2, ((w - 4) // 2 + 2 * pad2 - 4) // 2
        if h < 6 or w < 6 or qh < 1 or qw < 1 or x.shape[1] != cin:
            raise ValueError(f"{x.shape[1]}×{h}×{w} images do not fit these LeNets")
        out = torch.empty(len(x), k, qh * qw * CHANNELS)
        parts = min(torch.get_num_threads(), max(1, len(x) // 4))
        bounds = [len(x) * i // parts for i in range(parts + 1)]
        jobs = [(x[s:e], out[s:e]) for s, e in zip(bounds, bounds[1:])]
        threads = [threading.Thread(target=part, args=job) for job in jobs[1:]]
        for t in threads:
            t.start()
        part(*jobs[0])
        for t in threads:
            t.join()
        return out

    return run
