"""Fast exact CPU teacher inference for zoo LeNet / ConvNet / MLPNet groups.

Measured with ``bench/refine_speed.py --compare`` (interleaved, best of 3-5, 1 thread, same
process) on this repository's 2-core AMD EPYC (Zen 5, AVX-512), random 28×28 LeNets, other
jobs beside (load average in brackets). Against the plain loop at batch 1,024: K=10 5.6× (5.4)
and 6.0× (1.7); K=50 5.4× (5.8), 4.4× (1.8), 4.51× (4-5) and 5.14× (~1, 1.63 s against
8.35 s); the channels-last loop at 1,024 (the old 'auto') is 1.4-1.8×. The path reaches
~65-86 GFLOP/s, 35-52 % of what a big 3×3 conv reached in the same run (123-215 GFLOP/s);
bf16 4.9-7.3× the loop. For groups of ≥ 2 LeNets, stacked.py is used instead (all first convs
as one oneDNN conv, grouped conv2, in oneDNN's blocked layout): 6.4-7.7× the loop, 1.6-1.7×
this path at K=50 in the same runs (its older GEMM engine: 5.91× and 5.36×, 1.15× and 1.19×).

Where the time goes, and what this path does about it:

* **Cache-sized micro-batches** (the biggest win, ~3×). LeNet's first conv map is
  16×24×24 floats = 36 KiB per sample; at batch 1,024 it is 38 MB and every ReLU / max-pool
  pass streams it from DRAM. Micro-batches whose largest activation is ≤ 4 MiB (64 samples
  for LeNet) keep it in L2/L3 (2 and 8 MiB were within 5 %, 1 and 16 MiB 1.5× slower).
* **Channels-last** for 4-D inputs: oneDNN's conv runs NHWC without reorders.
* **2×2 max-pool as two ``torch.maximum``** of NHWC views (:class:`Pool2x2`, bit-identical):
  oneDNN's pool was 29 % of the time, this one is 3.3× faster (1.2× end to end).
* **Max-pool before ReLU**: ``maxpool(relu(a)) == relu(maxpool(a))`` exactly (ReLU is monotone
  non-decreasing), and the ReLU then touches a 4× smaller map.

Tried and left out (same bench): one grouped convolution of all K teachers (``groups=K``,
weights concatenated) was 0.9× the loop (oneDNN's grouped kernels are slow at 16 channels per
group); an im2col GEMM of all K first convs was no faster than K oneDNN convs; the vmap stack
was 0.36× the old 'auto' in issue 14's measurement; ``torch.jit.freeze`` gave ≤ 5 % and
``torch.jit.trace`` is deprecated in torch 2.13; ``torch.compile`` (inductor, gcc) compiled in
~20 s for K=10 and ran 0.9× this path (before Pool2x2). The remaining bottleneck (78 % of
the profile) is oneDNN's conv, above all the first one (1 input channel, 5×5: a GEMM with inner
dimension 25 reaching ~25 GFLOP/s where conv2 reaches ~90 and a big conv ~180); an im2col +
addmm first conv sharing the unfold across the K teachers was within noise of it.

Tried for the K=50 first conv (issue 14, 512-2,048 images, 1 thread, load 2-5, interleaved; what
helped is stacked.py): one dense oneDNN conv 1 → 800 channels (all teachers' filters, NHWC) took
0.90-1.07 s per 2,048 images at 4-16 images per call (12.4 s at 2, 3.8 s at 32) against 0.72 s
for the 50 per-teacher convs here: slower. One MKL GEMM over a shared unfold, ``(576·b, 25) @
(25, 800)``, ~0.56 s, and 0.68-0.73 s with the 2×2 max-pool fused as a max over four row blocks
(load 3.5-5): kept (stacked.py). The same GEMM as a 1×1 oneDNN conv: 59 against 92 GFLOP/s. A
per-teacher output layout (bmm to (K, rows, 16)): 1.8× slower than the wide GEMM. Teacher blocks
of 10 (160 GEMM columns): the GEMM 0.63×, the whole path 0.88× blocks of 25. ``torch.compile``
(inductor, gcc) of stacked.py's block for 32 images: 13 s to compile, 0.89× the eager stacked
path (it gives up the L2-sized GEMM rows). conv2 as one grouped conv over a block of teachers
(input already channels-last, teacher-major): ~1.25× 50 per-teacher convs; bigger conv2 batches
(64, 128) were not faster. Later (stacked.py's oneDNN engine): the same dense 1 → 16·n conv
in oneDNN's blocked layout (nChw16c, mkldnn tensors) reached 173-177 GFLOP/s alone, and kept
blocked through oneDNN's pool into the grouped conv2 it is now the default there.

``precision='bf16'`` (off by default) runs the copies in bfloat16 (AVX-512 BF16 on this CPU):
argmax agreement with the fp32 loop 99.7 % on random LeNets (max |Δlogit| 1e-3) and 99.7 %
on digits-trained ones; 1.0-1.25× the fp32 fast path, depending on the run.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import nn

from mrtf.models.zoo import ConvNet, LeNet, MLPNet

FAST_ARCHS = (LeNet, ConvNet, MLPNet)
PRECISIONS = ("fp32", "bf16")
ACTIVATION_BUDGET = 4 * 2**20  # bytes of the largest activation per micro-batch (L2/L3 sized)
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def eligible(model: nn.Module) -> bool:
    """Only the zoo's plain feed-forward nets: their layers are known to be order-exact here."""
    return type(model) in FAST_ARCHS


class Pool2x2(nn.Module):
    """``MaxPool2d(2)`` as two ``torch.maximum`` of strided NHWC views: bit-identical (max is
    exact), ~3.3x faster than oneDNN's channels-last max-pool on a 64×16×24×24 map (79 vs
    259 µs, 1 thread), which computes indices even in inference mode and was 29 % of the fast
    path's time in a profile. Other layouts go to ``F.max_pool2d``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or not x.is_contiguous(memory_format=torch.channels_last):
            return nn.functional.max_pool2d(x, 2)
        b, c, h, w = x.shape
        t = x.permute(0, 2, 3, 1)[:, : h // 2 * 2, : w // 2 * 2]
        t = t.contiguous().reshape(b, h // 2 * 2, w // 2, 2 * c)
        t = torch.maximum(t[..., :c], t[..., c:]).reshape(b, h // 2, 2, w // 2, c)
        return torch.maximum(t[:, :, 0], t[:, :, 1]).permute(0, 3, 1, 2)


def _is_pool2(m: nn.Module) -> bool:
    return isinstance(m, nn.MaxPool2d) and m.kernel_size in (2, (2, 2)) and \
        m.stride in (2, (2, 2), None) and m.padding in (0, (0, 0)) and \
        m.dilation in (1, (1, 1)) and not m.ceil_mode and not m.return_indices


def pool_before_relu(model: nn.Module) -> nn.Module:
    """A copy where each ``ReLU, MaxPool2d`` pair inside an ``nn.Sequential`` is swapped, and
    each 2×2 max-pool is a :class:`Pool2x2`.

    Exact (bit for bit): ReLU is monotone non-decreasing, so it commutes with max; the ReLU
    then runs on the 4× smaller pooled map.
    """
    out = copy.deepcopy(model)
    for seq in out.modules():
        if not isinstance(seq, nn.Sequential):
            continue
        layers = [Pool2x2() if _is_pool2(m) else m for m in seq]
        for i in range(len(layers) - 1):
            if isinstance(layers[i], nn.ReLU) and isinstance(layers[i + 1], (nn.MaxPool2d,
                                                                              Pool2x2)):
                layers[i], layers[i + 1] = layers[i + 1], layers[i]
        for i, layer in enumerate(layers):
            seq[i] = layer
    return out


def largest_activation(model: nn.Module, probe: torch.Tensor) -> int:
    """Elements per sample of the largest leaf-module output on a 1-sample ``probe``."""
    sizes: list[int] = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: sizes.append(o.numel()))
             for m in model.modules() if len(list(m.children())) == 0]
    try:
        with torch.inference_mode():
            model(probe[:1])
    finally:
        for h in hooks:
            h.remove()
    return max(sizes + [int(probe[:1].numel())])


def micro_batch(model: nn.Module, probe: torch.Tensor, budget: int = ACTIVATION_BUDGET
                ) -> int | None:
    """Rows per micro-batch so the largest activation fits ``budget`` bytes (a power of 2 in
    [16, 1024]); None (the whole chunk) for models without convolutions, whose cost is
    weight-bound GEMMs that prefer big batches."""
    if not any(isinstance(m, nn.Conv2d) for m in model.modules()):
        return None
    per_sample = 4 * largest_activation(model, probe)
    rows = max(1, budget // per_sample)
    return int(min(1024, max(16, 1 << (rows.bit_length() - 1))))


def _fast_copy(model: nn.Module, nhwc: bool) -> nn.Module:
    fast = pool_before_relu(model).eval()
    return fast.to(memory_format=torch.channels_last) if nhwc else fast


def _agrees(fast: Sequence[nn.Module], ref: Sequence[nn.Module], probe: torch.Tensor,
            prep: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Each copy's logits within 1e-4 × the logit scale of its reference model on ``probe``."""
    with torch.inference_mode():
        for f, r in zip(fast, ref):
            want = r(probe)
            scale = float(want.abs().max()) + 1.0
            if not torch.allclose(f(prep(probe)).float(), want, rtol=1e-4, atol=1e-4 * scale):
                return False
    return True


def fast_forward(models: Sequence[nn.Module], probe: torch.Tensor, precision: str = "fp32"
                 ) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``x (B, ...) -> logits (G, B, C)`` float32 for a same-architecture group, or None when the
    group is not eligible or the fp32 copies disagree with the models on ``probe``.

    The agreement check always runs in fp32; with ``precision='bf16'`` the checked copies are
    then cast to bfloat16 (inputs too) and the logits cast back to float32.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if not models or not all(eligible(m) for m in models):
        return None
    nhwc = probe.dim() == 4

    def prep(x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last) if nhwc else x

    fast = [_fast_copy(m, nhwc) for m in models]
    if not _agrees(fast, models, probe, prep):
        return None
    dtype = _DTYPES[precision]
    fast = [f.to(dtype) for f in fast]
    rows = micro_batch(models[0], probe)

    def run(x: torch.Tensor) -> torch.Tensor:
        x = prep(x.to(dtype))
        step = rows or len(x)
        parts = [torch.stack([f(x[s:s + step]) for f in fast]) for s in range(0, len(x), step)]
        return torch.cat(parts, 1).float() if len(parts) > 1 else parts[0].float()

    return run


def fast_features(model: nn.Module, probe: torch.Tensor
                  ) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None:
    """``x -> (features (B, D), logits (B, C))`` float32 of one eligible zoo model in one
    pass on the fast copy (the micro-batches and layout of :func:`fast_forward`; a LeNet group
    on stacked.py gives the same logits up to summation order), or None when not eligible or
    the copy disagrees with
    the model on ``probe``. The streaming and in-memory refinery take θ_{t+1}'s features and
    logits from it: the features cost no second forward in the plain layout (5x slower)."""
    if not eligible(model) or not hasattr(model, "forward_features"):
        return None
    nhwc = probe.dim() == 4

    def prep(x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last) if nhwc else x

    fast = _fast_copy(model, nhwc)
    with torch.inference_mode():
        h_ref, lg_ref = model.forward_features(probe)
        h, lg = fast.forward_features(prep(probe))
    for got, want in ((h, h_ref), (lg, lg_ref)):
        scale = float(want.abs().max()) + 1.0
        if not torch.allclose(got.flatten(1), want.flatten(1), rtol=1e-4, atol=1e-4 * scale):
            return None
    rows = micro_batch(model, probe)

    def run(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = prep(x)
        step = rows or len(x)
        parts = [fast.forward_features(x[s:s + step]) for s in range(0, len(x), step)]
        return (torch.cat([p[0].flatten(1) for p in parts]), torch.cat([p[1] for p in parts]))

    return run
