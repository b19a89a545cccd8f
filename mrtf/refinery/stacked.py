"""All K zoo LeNet teachers in one pass on CPU. Three engines, tried in this order: the compiled
kernel (native.py), both convolutions over blocks of teachers in oneDNN's blocked layout, or
the first as one GEMM over a shared unfold; each must agree with the models on a probe.

**Native engine** (where a C compiler and AVX-512 exist: native.py builds lenet_kernel.c at
first use). Per image and teacher, conv1's four outputs of each 2×2 pool window are summed
in registers and maxed there, so conv1's map is never written; the pooled 12×12×16 map stays
in L1 for conv2, pooled the same way. Every multiply-add is one AVX-512 FMA (16 channels =
one vector). The features come out in (h, w, c) order, so each teacher's first classifier
weight has its columns reordered once; the classifier runs as oneDNN inner products (below).
It removes what capped the oneDNN engine: conv1's map going through L3 to a separate pool
(oneDNN refuses a max-pool as a fused post-op). Images are split between threads, one image
whole per thread, so its logits do not depend on the thread count.

**oneDNN engine.** The K teachers see the same image, so their first convolutions are one conv
with 1 input and 16·n output channels per block of n = 25 teachers. Its output stays in
oneDNN's blocked layout (nChw16c), where one 16-channel block is one teacher's channels: the
2×2 max-pool (oneDNN's, inference kind: no indices), the ReLU after it (exact: ReLU commutes
with max, on a 4× smaller map) and conv2 as one grouped conv (``groups`` = n, weights
prepacked once) read it without reorders; only the pooled 16×4×4 maps come back to plain
tensors, gathered for the whole chunk, and each teacher's classifier runs on all its rows as
three oneDNN inner products (ReLU fused). Why oneDNN throughout: on this AMD CPU (Zen 5, AVX-512)
MKL's GEMM runs AVX2 code, 92 GFLOP/s for a 2,048² mm where oneDNN's inner product reaches 214;
the GEMM engine's conv1 GEMM ``(576, 25) @ (25, 800)`` ran 93 against 194. (The measured
rates are in docs/benchmarks/scale.md.)

**GEMM engine** (when torch lacks the oneDNN ops): the unfold of a micro-batch laid out by 2×2
pooling offset, ``(4, rows, 25)``, times all K·16 filters (one MKL GEMM); the max-pool is an
amax of the four row blocks, bias and ReLU after it; the pooled map, channels-last with
teacher-major channels, goes to a grouped conv2, the classifier to three ``baddbmm``.

Sums are ordered differently from the model's own layers, so logits are not bit-identical:
|Δ| ≤ 1e-4 × the logit scale is checked on a probe before a path is used (argmax agreement is
measured in the bench).

Measured (``bench/refine_speed.py --compare --K 50 --threads 1 --repeats 5``, 50 random LeNets ×
2,048 images, interleaved in one process, ``bench/results/teacher_compare-K50.json``): the
native engine 0.69-0.71 s in three idle runs on 2026-11-23 = 12.6×, 11.0× and 8.1× the plain
loop (the loop's own time moved 5.7-8.7 s; four earlier runs that day 8.1-13.4×), 198-203
GFLOP/s = 89-91 % of the big conv's rate, max |Δlogit| 7.8e-8, argmax 100 %; 1.35-1.38× the
oneDNN engine. At K = 10: 12.1× the loop, 91 %.

Native engine, what the time goes to (K = 50, 2,048 images, 1 thread): the kernel 0.67 s
(conv FLOPs at ~196 GFLOP/s), the classifiers 0.065 s (~130 GFLOP/s). The kernel is near the
FMA limit: each FMA takes its input as a broadcast load and every 16 FMAs one weight load, so
two loads per cycle are about what two FMAs per cycle need. Tuned: 4 pool windows per conv2
block (16 accumulators; 2 windows 5 % slower, 3 windows 17 %), 2 per conv1 block; slices of
32 MiB of features (:data:`NATIVE_BUDGET`; 8-128 MiB within ±5 %). Built without AVX-512
(``-march=haswell``) the kernel ran 15× slower (its 16-float accumulators spill), so it is
not built there.

oneDNN engine, the default before (same bench, six runs on 2026-11-23, now ``runs_onednn``
there): no other process running, 0.961 s = 7.99× the plain loop (7.68 s) and 1.76×
fastpath.py, 145 GFLOP/s = 67 % of the big conv's 218 in the same run; two more such runs
7.68× and 7.34× (loop 8.59 and 7.23 s: the VM's own speed moves); beside one other job (load
1.1-1.9) 7.40×, beside more (load 2.7, 4.3) 6.50× and 6.36×; 1.57-1.76× fastpath.py in all
six. Max |Δlogit| 7.5e-8,
argmax 100 %. Against the GEMM engine,
interleaved in one process: 1.34-1.58× faster (1.39 s against 0.92-0.98 s idle). Profile
(torch.profiler, self time, load ~1.6): oneDNN's grouped conv2 42 % (~154 GFLOP/s), conv1 30 %
(~121), the conv1 max-pool 11 % (a bandwidth pass over the 4× map: 1.8 MB per image at 25
teachers, beyond L2), the classifier 6 %, the conv2 pool 3 %, the ReLU after the first pool 2 %,
back to plain tensors 2 %. The bottleneck: oneDNN's two convolutions, at 68-82 % of their
rate alone (the conv1 map's round trip through L3 for the pool costs them and the pool).
What did not help (same harness): the ReLU fused into conv1 (±1 %), TorchScript for the
per-micro-batch ops (±1 %), 1-2 images per call (1.09-1.5× slower: each oneDNN call costs
~10-30 µs before any work), blocks of 5-17 teachers (1.03-1.18×), the loops swapped (teacher
blocks outer, 1.06×). For few teachers see teachers.STACKED_MIN.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mrtf.models.zoo import LeNet
from mrtf.refinery.fastpath import Pool2x2
from mrtf.refinery.native import native_features

# Tuned at K = 50 on 512-1,024 images, 1 thread, interleaved, load 3-5: blocks of 10 teachers
# made the conv1 GEMM too narrow (160 columns: whole path 0.88x of 25), 50 was within ±10 %
# of 25 (0.92x, 1.04x); 1 or 2 images per GEMM were within 5 %; 32 images per grouped conv2
# beat 16 (0.85x) and 64-128 (0.9-0.96x). At K = 1 a GEMM per image was 2x slower than
# fastpath.py (call overheads): the images per GEMM now fill GEMM_BUDGET.
TEACHER_BLOCK = 25  # teachers per conv1 GEMM and grouped conv2
GEMM_BUDGET = 2**20  # bytes of one conv1 GEMM's output: L2-sized (1 image at 25 teachers)
ROWS_CONV2 = 32  # images per grouped conv2 call
# The oneDNN path, K = 50, 2,048 images, 1 thread, interleaved runs at load 1.5-2.6 (the GEMM
# path 1.41-1.79 s in the same runs): blocks of 25 teachers at 6 images per call 0.97-1.02 s,
# 8: 0.99-1.07, 4: 1.00-1.06, 2: 1.14, 10-16: 1.03-1.17 (the conv1 map, 1.8 MB per image at 25
# teachers, leaves L2 and then L3); blocks of 10 at 4-8 images 1.07-1.20 s, 5 at 8: 1.23, 50
# at 2: 1.08 (each call costs ~10-30 µs before any work).
ONEDNN_BLOCK = 25  # teachers per oneDNN conv call
ONEDNN_ROWS = 6  # images per oneDNN conv call
# The native engine's features of one slice of images, (rows, K, D) float32: 32 MiB (655
# images at K = 50); the whole 1,024-image chunk would be 50 MB, and 200 at 4,096.
NATIVE_BUDGET = 2**25
ENGINES = ("auto", "native", "onednn", "gemm")


def _plain(conv: nn.Module) -> bool:
    return (isinstance(conv, nn.Conv2d) and conv.stride == (1, 1) and conv.dilation == (1, 1)
            and conv.groups == 1 and conv.bias is not None
            and conv.padding_mode == "zeros" and isinstance(conv.padding, tuple))


def eligible(models: Sequence[nn.Module]) -> bool:
    """Zoo LeNets with the zoo's exact layer sequence (conv, ReLU, 2×2 max-pool twice, flatten;
    linear-ReLU-linear-ReLU-linear), plain convolutions, all of one shape."""
    if not models or not all(type(m) is LeNet for m in models):
        return False
    kinds = ["Conv2d", "ReLU", "MaxPool2d", "Conv2d", "ReLU", "MaxPool2d", "Flatten"]
    for m in models:
        if [type(x).__name__ for x in m.body] != kinds or \
                [type(x).__name__ for x in m.classifier] != ["Linear", "ReLU"] * 2 + ["Linear"]:
            return False
        pools = (m.body[2], m.body[5])
        if not all(_plain(m.body[i]) for i in (0, 3)) or not all(
                p.kernel_size in (2, (2, 2)) and p.stride in (2, (2, 2)) and
                p.padding in (0, (0, 0)) and not p.ceil_mode and p.dilation in (1, (1, 1))
                for p in pools):
            return False
    shapes = {tuple(tuple(p.shape) for p in m.parameters()) for m in models}
    return len(shapes) == 1 and len({(m.body[0].padding, m.body[3].padding) for m in models}) == 1


def _pooled_unfold(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x (B, C, H, W)`` (already padded) → ``(B, 4, P·Q, C·k·k)``: the conv patches of output
    position (2p + di, 2q + dj) at ``[b, 2·di + dj, p·Q + q]``, for the P×Q pooled positions
    (an odd last row/column is dropped, as ``MaxPool2d(2)`` drops it)."""
    b, c, h, w = x.shape
    p, q = (h - k + 1) // 2, (w - k + 1) // 2
    x = x.contiguous()
    s = x.stride()
    view = x.as_strided((b, 2, 2, p, q, c, k, k),
                        (s[0], s[2], s[3], 2 * s[2], 2 * s[3], s[1], s[2], s[3]))
    return view.reshape(b, 4, p * q, c * k * k)


class _Block(nn.Module):
    """The stacked weights of ``models`` (one teacher block), as buffers: ``.to(device)``
    moves them all, and a block built from models on a device computes there (issue 36: its
    pooling buffer was a CPU tensor, so the engine failed on CUDA)."""

    def __init__(self, models: Sequence[nn.Module]) -> None:
        super().__init__()
        c1 = [m.body[0] for m in models]
        self.register_buffer(
            "w1", torch.cat([c.weight.detach().flatten(1) for c in c1]).t().contiguous())
        self.register_buffer("b1", torch.cat([c.bias.detach() for c in c1]))
        self.register_buffer("w2", torch.cat([m.body[3].weight.detach() for m in models])
                             .contiguous(memory_format=torch.channels_last))
        self.register_buffer("b2", torch.cat([m.body[3].bias.detach() for m in models]))
        self.pad2 = models[0].body[3].padding
        self.n = len(models)
        lin = [[m.classifier[i] for m in models] for i in (0, 2, 4)]
        for i, fs in enumerate(lin):
            self.register_buffer(
                f"fw{i}", torch.stack([f.weight.detach().t() for f in fs]).contiguous())
            self.register_buffer(f"fb{i}", torch.stack([f.bias.detach()[None] for f in fs]))

    @property
    def fw(self) -> list[torch.Tensor]:
        return [self.fw0, self.fw1, self.fw2]

    @property
    def fb(self) -> list[torch.Tensor]:
        return [self.fb0, self.fb1, self.fb2]

    def forward(self, u: torch.Tensor, shape: tuple[int, int], rows1: int | None
                ) -> torch.Tensor:
        """``u`` (B, 4, P·Q, C·k·k) → logits (n, B, classes); ``rows1`` images per conv1
        GEMM (None: as many as fit :data:`GEMM_BUDGET`)."""
        b, _, pq, ck = u.shape
        width = self.w1.shape[1]
        rows1 = rows1 or max(1, GEMM_BUDGET // (4 * pq * width * 4))
        pooled = torch.empty(b, pq, width, dtype=u.dtype, device=u.device)
        for s in range(0, b, rows1):
            e = min(b, s + rows1)
            y = torch.mm(u[s:e].reshape(-1, ck), self.w1).view(e - s, 4, pq, width)
            torch.amax(y, 1, out=pooled[s:e])  # 3-5 % faster than three torch.maximum
        pooled.add_(self.b1).clamp_min_(0)
        h = pooled.view(b, *shape, width).permute(0, 3, 1, 2)  # channels-last, no copy
        h = F.conv2d(h, self.w2, self.b2, padding=self.pad2, groups=self.n)
        h = Pool2x2()(h).clamp_min_(0)  # max-pool before ReLU: exact, 4× fewer elements
        _, _, p2, q2 = h.shape
        # teacher-major (n, B, 16·p2·q2) in the model's own (c, h, w) flatten order
        z = h.permute(0, 2, 3, 1).reshape(b, p2, q2, self.n, -1).permute(3, 0, 4, 1, 2)
        z = z.reshape(self.n, b, -1)
        z = torch.baddbmm(self.fb[0], z, self.fw[0]).clamp_min_(0)
        z = torch.baddbmm(self.fb[1], z, self.fw[1]).clamp_min_(0)
        return torch.baddbmm(self.fb[2], z, self.fw[2])


_MKLDNN = torch.ops.mkldnn


def _onednn_available() -> bool:
    """The private oneDNN op the path calls (inductor's fused linear) exists."""
    return torch.backends.mkldnn.is_available() and hasattr(_MKLDNN, "_linear_pointwise")


def _packed(weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor], pad: list[int],
            groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenated conv weights and biases as oneDNN tensors, the weights reordered once."""
    w = torch.cat([x.detach() for x in weights]).contiguous().to_mkldnn()
    w = torch._C._nn.mkldnn_reorder_conv2d_weight(w, pad, [1, 1], [1, 1], groups)
    return w, torch.cat([b.detach() for b in biases]).to_mkldnn()


class _OneDNNBlock:
    """One teacher block in oneDNN's blocked layout (nChw16c: one 16-channel block = one
    teacher's channels, so the grouped conv2 needs no reorder): conv1 of all teachers as one
    1 → 16·n conv, oneDNN's 2×2 max-pool, ReLU, conv2 grouped, pool; the classifier per
    teacher as oneDNN inner products (AVX-512; MKL's GEMM runs AVX2 on this AMD CPU: 92
    GFLOP/s for a 2,048² mm against 214 for oneDNN's, and the (576, 25) @ (25, 800) conv1
    GEMM of the GEMM path 93 against 194)."""

    def __init__(self, models: Sequence[nn.Module]) -> None:
        c1, c2 = [m.body[0] for m in models], [m.body[3] for m in models]
        self.n = len(models)
        self.pad1, self.pad2 = list(c1[0].padding), list(c2[0].padding)
        # weights prepacked once in oneDNN's layout: conv2's (16·n × 16 × 5 × 5, 640 KB at
        # n = 25) took 0.55 ms to reorder per call
        self.w1, self.b1 = _packed([c.weight for c in c1], [c.bias for c in c1], self.pad1, 1)
        self.w2, self.b2 = _packed([c.weight for c in c2], [c.bias for c in c2], self.pad2, self.n)
        self.fc = _classifiers(models)

    def features(self, xm: torch.Tensor) -> torch.Tensor:
        """``xm`` (b, C, H, W) mkldnn → (b, n, D) flattened conv maps in (c, h, w) order,
        before the last ReLU."""
        y = torch.mkldnn_convolution(xm, self.w1, self.b1, self.pad1, [1, 1], [1, 1], 1)
        y = torch.relu_(F.max_pool2d(y, 2))  # pool before ReLU: exact, 4× fewer elements
        h = torch.mkldnn_convolution(y, self.w2, self.b2, self.pad2, [1, 1], [1, 1], self.n)
        h = F.max_pool2d(h, 2).to_dense()  # NCHW: teacher-major channels; ReLU in the copy
        return h.view(len(h), self.n, -1)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        return _classify(z, self.fc)


def _classify(z: torch.Tensor, fc: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]]
              ) -> torch.Tensor:
    """``z`` (B, n, D) → logits (n, B, classes); per teacher, ReLUs fused, as oneDNN inner
    products where torch has them (oneDNN reads the strided (B, D) rows of a teacher as fast as
    contiguous ones: 13.9 against 14.0 ms), else ``F.linear``."""
    out = []
    onednn = _onednn_available()
    for zi, ((w1, b1), (w2, b2), (w3, b3)) in zip(z.unbind(1), fc):
        if onednn:
            t = _MKLDNN._linear_pointwise(zi, w1, b1, "relu", [None], "")
            t = _MKLDNN._linear_pointwise(t, w2, b2, "relu", [None], "")
            out.append(_MKLDNN._linear_pointwise(t, w3, b3, "none", [], ""))
        else:
            t = F.linear(F.linear(zi, w1, b1).clamp_min_(0), w2, b2).clamp_min_(0)
            out.append(F.linear(t, w3, b3))
    return torch.stack(out)


def _classifiers(models: Sequence[nn.Module], hw: tuple[int, int] | None = None
                 ) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Each teacher's three (weight, bias); with ``hw`` = the last map's (h, w), the first
    weight's columns reordered from (c, h, w) to (h, w, c), the native kernel's order."""
    fc = [[(m.classifier[i].weight.detach().contiguous(), m.classifier[i].bias.detach())
           for i in (0, 2, 4)] for m in models]
    if hw is not None:
        for f in fc:
            w, b = f[0]
            f[0] = (w.view(len(w), -1, *hw).permute(0, 2, 3, 1).reshape(len(w), -1).contiguous(), b)
    return fc


def _native_run(models: Sequence[nn.Module], probe: torch.Tensor
                ) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The compiled kernel's conv features (native.py), then the classifiers, over slices of
    at most :data:`NATIVE_BUDGET` bytes of features."""
    feats = native_features(models)
    if feats is None:
        return None
    try:
        z = feats(probe[:1])
    except ValueError:  # images too small for the kernel's maps
        return None
    h = models[0].body[:-1](probe[:1].float())  # the last map's shape, by the model itself
    if z.shape[2] != h[0].numel():
        return None
    fc = _classifiers(models, tuple(h.shape[2:]))
    rows = max(64, NATIVE_BUDGET // z[0].numel() // 4)

    def run(x: torch.Tensor) -> torch.Tensor:
        out = [_classify(feats(x[s:s + rows]), fc) for s in range(0, len(x), rows)]
        return torch.cat(out, 1) if len(out) > 1 else out[0]

    return run


def _onednn_run(models: Sequence[nn.Module], block: int, rows: int
                ) -> Callable[[torch.Tensor], torch.Tensor]:
    blocks = [_OneDNNBlock(models[i:i + block]) for i in range(0, len(models), block)]
    # The (B, n, D) feature buffers (26 MB per block of 25 at B = 1,024) are kept between calls
    # of the same B, per thread: allocated per call they came fresh from the OS, 14,000-29,000
    # page faults per 2,048 images (none now; the time moved within the noise, ±5 %).
    local = threading.local()

    def run(x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        zs: list[torch.Tensor] = getattr(local, "zs", [])
        if not zs or len(zs[0]) != len(x):
            zs = local.zs = []
        for s in range(0, len(x), rows):
            xm = x[s:s + rows].contiguous().to_mkldnn()
            for j, blk in enumerate(blocks):
                z = blk.features(xm)
                if len(zs) == j:  # all B rows: the classifier's GEMMs want them together
                    zs.append(torch.empty(len(x), blk.n, z.shape[2]))
                torch.clamp_min(z, 0, out=zs[j][s:s + rows])
        return torch.cat([blk.classify(z) for blk, z in zip(blocks, zs)])

    return run


def _gemm_run(models: Sequence[nn.Module], block: int, rows1: int | None, rows2: int
              ) -> Callable[[torch.Tensor], torch.Tensor]:
    blocks = [_Block(models[i:i + block]) for i in range(0, len(models), block)]
    conv1 = models[0].body[0]
    k, pad = conv1.kernel_size[0], conv1.padding

    def run(x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        if pad != (0, 0):
            x = F.pad(x, (pad[1], pad[1], pad[0], pad[0]))
        shape = ((x.shape[2] - k + 1) // 2, (x.shape[3] - k + 1) // 2)
        out = []
        for s in range(0, len(x), rows2):
            u = _pooled_unfold(x[s:s + rows2], k)
            out.append(torch.cat([blk.forward(u, shape, rows1) for blk in blocks]))
        return torch.cat(out, 1) if len(out) > 1 else out[0]

    return run


def _agrees(run: Callable[[torch.Tensor], torch.Tensor], models: Sequence[nn.Module],
            probe: torch.Tensor) -> bool:
    """Each teacher's logits within 1e-4 × its logit scale of the model's own on ``probe``."""
    with torch.inference_mode():
        got = run(probe)
        for i, m in enumerate(models):
            want = m(probe)
            scale = float(want.abs().max()) + 1.0
            if not torch.allclose(got[i], want, rtol=1e-4, atol=1e-4 * scale):
                return False
    return True


def stacked_forward(models: Sequence[nn.Module], probe: torch.Tensor,
                    block: int | None = None, rows1: int | None = None,
                    rows2: int | None = None, engine: str = "auto"
                    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``x (B, C, H, W) -> logits (K, B, classes)`` float32 for K same-shape zoo LeNets, or
    None when they are not eligible or the result is not within 1e-4 × the logit scale of each
    model's own forward on ``probe``.

    ``engine`` 'onednn' (blocked-layout oneDNN convs; ``block`` teachers and ``rows2`` images
    per call), 'gemm' (the shared-unfold GEMM; also ``rows1`` images per conv1 GEMM) or 'auto'
    (oneDNN when its ops exist and agree on ``probe``, else the GEMM path). Off the CPU (models
    and ``probe`` on CUDA) only the GEMM engine runs, on that device."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if probe.dim() != 4 or not eligible(models):
        return None
    conv1 = models[0].body[0]
    if conv1.kernel_size[0] != conv1.kernel_size[1]:
        return None
    if probe.device.type != "cpu":  # the native kernel and oneDNN are CPU engines
        if engine not in ("auto", "gemm"):
            return None
        engine = "gemm"
    if engine in ("auto", "native"):
        run = _native_run(models, probe)
        if run is not None and _agrees(run, models, probe):
            return run
        if engine == "native":
            return None
    if engine in ("auto", "onednn") and _onednn_available():
        try:
            run = _onednn_run(models, block or ONEDNN_BLOCK, rows2 or ONEDNN_ROWS)
            if _agrees(run, models, probe):
                return run
        except (RuntimeError, AttributeError, TypeError):  # an op this build lacks or spells
            # differently: the GEMM path
            pass
    if engine == "onednn":
        return None
    run = _gemm_run(models, block or TEACHER_BLOCK, rows1, rows2 or ROWS_CONV2)
    return run if _agrees(run, models, probe) else None
