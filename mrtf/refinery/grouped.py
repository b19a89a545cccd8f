"""All K zoo LeNet teachers as one network, for CUDA: grouped convolutions and batched matmuls.

The K teachers see the same images, so their first convolutions are one convolution with
K·16 output channels; their second convolutions one convolution with ``groups = K`` (teacher
k's 16 channels read only teacher k's 16); their classifiers three batched matrix products
over (K, rows, features). Six kernels per chunk instead of about 8·K: on a GPU, where each of
the loop's kernels is too small to fill the device, the launches and the half-empty kernels
are what the loop's time goes to (issue 36). stacked.py does the same job on the CPU with
kernels that keep an image in cache; it does not run on CUDA.

The sums are ordered as the models' own layers order them, but cuDNN may pick another
algorithm for a grouped convolution than for K separate ones: logits agree to float32
rounding, not bit for bit, so :func:`grouped_forward` checks them on a probe first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mrtf.refinery.stacked import eligible

#: bytes of the first convolution's output per call (K·16 maps of every row): a chunk is
#: split into slices within it, so K = 50 teachers do not ask for tens of GB at once
CONV_BUDGET = 2**30


class GroupedLeNets(nn.Module):
    """K zoo LeNets of one shape (:func:`mrtf.refinery.stacked.eligible`) as one module:
    ``x (B, C_in, H, W) → logits (K, B, C)``. A snapshot of their weights at construction."""

    def __init__(self, models: Sequence[nn.Module]) -> None:
        super().__init__()
        first = models[0]
        self.k = len(models)
        conv1, conv2 = first.body[0], first.body[3]
        self.pads = (conv1.padding, conv2.padding)
        self.maps = conv1.out_channels
        with torch.no_grad():
            for i, name in ((0, "1"), (3, "2")):  # conv2: (K·16, 16, 5, 5), groups = K
                convs = [m.body[i] for m in models]
                self.register_buffer(f"w{name}", torch.cat([c.weight for c in convs]))
                self.register_buffer(f"b{name}", torch.cat([c.bias for c in convs]))
            for j, i in enumerate((0, 2, 4)):  # classifier: (K, in, out) and (K, 1, out)
                layers = [m.classifier[i] for m in models]
                self.register_buffer(f"fc{j}", torch.stack([x.weight.t() for x in layers]))
                self.register_buffer(f"fb{j}", torch.stack([x.bias for x in layers])[:, None])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        per_row = self.k * self.maps * x.shape[-2] * x.shape[-1] * x.element_size()
        rows = max(1, CONV_BUDGET // max(1, per_row))
        return torch.cat([self._logits(x[s:s + rows]) for s in range(0, len(x), rows)], 1)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        # ReLU before or after the max-pool: the same values (ReLU is monotone)
        h = F.max_pool2d(F.relu(F.conv2d(x, self.w1, self.b1, padding=self.pads[0])), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, self.w2, self.b2, padding=self.pads[1],
                                         groups=self.k)), 2)
        # (B, K·16, h, w) → (K, B, 16·h·w): teacher k's flattened map in nn.Flatten's order
        h = h.reshape(len(x), self.k, -1).transpose(0, 1)
        h = torch.relu(torch.baddbmm(self.fb0, h, self.fc0))
        h = torch.relu(torch.baddbmm(self.fb1, h, self.fc1))
        return torch.baddbmm(self.fb2, h, self.fc2)


def grouped_forward(models: Sequence[nn.Module], probe: torch.Tensor,
                    tolerance: float = 1e-4) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``x → (K, B, C)`` for ≥ 2 eligible LeNets on ``probe``'s device, or None (not
    eligible, or its logits differ from the models' own on ``probe`` by more than
    ``tolerance`` × their scale)."""
    if len(models) < 2 or not eligible(models):
        return None
    with torch.inference_mode():
        grouped = GroupedLeNets(models).to(probe.device)
        got = grouped(probe)
        want = torch.stack([m(probe) for m in models])
    scale = float(want.abs().max()) + 1e-12
    if got.shape != want.shape or float((got - want).abs().max()) > tolerance * scale:
        return None
    return grouped
