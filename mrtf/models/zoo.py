"""The paper networks (MrTF Sect. 5; docs/reference-code.md), written in plain torch.

Every model returns ``(features, logits)`` from :meth:`forward_features` in one pass; ``features``
is the penultimate representation flattened to ``(B, D)`` and ``D`` is ``model.feature_dim``.
``forward(x)`` returns logits only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

NORMS = ("batch", "group", "none")


class FeatureModel(nn.Module):
    """Base class for zoo models: ``forward_features(x) -> (h, logits)``."""

    feature_dim: int
    num_classes: int

    def forward_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)[1]


def norm_layer(kind: str, channels: int) -> nn.Module:
    """BatchNorm, GroupNorm with one channel per group (FedKF: BN fails on non-IID), or none."""
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(channels, channels)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"unknown norm {kind!r}; choose one of {', '.join(NORMS)}")


def init_weights(module: nn.Module) -> None:
    """Conv: Kaiming-normal (fan_out) as in the reference. Linear: PyTorch's default, because the
    reference's N(0, 0.01) stalls training (docs/reference-code.md, measured)."""
    if _on_meta(module):  # shapes only (io.limits): a meta init imports torch._dynamo (slow)
        return
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def _flat_dim(body: nn.Module, in_channels: int, image_size: int) -> int:
    """The body's flattened output size for one image. A body on the meta device (built so by
    io.limits.reference_shapes) is sized by the layers' own arithmetic: a meta forward
    imports torch's symbolic-shape machinery (sympy), seconds of every refine's start-up
    (docs/benchmarks/gpu.md, 2026-11-26)."""
    if _on_meta(body):
        size = _sized(body, in_channels, image_size)
        if size is not None:
            return size
    with torch.no_grad():
        was_training = body.training
        body.eval()
        out = body(torch.zeros(1, in_channels, image_size, image_size))
        body.train(was_training)
    return int(out.flatten(1).shape[1])


def _on_meta(module: nn.Module) -> bool:
    return any(p.is_meta for p in module.parameters())


#: layers that keep (channels, height, width)
_SAME_SHAPE = (nn.ReLU, nn.Dropout, nn.Dropout2d, nn.BatchNorm2d, nn.GroupNorm, nn.Identity,
               nn.Flatten)


def _sized(body: nn.Module, channels: int, size: int) -> int | None:
    """channels × height × width after ``body``'s convolutions and poolings (PyTorch's output
    size formula), or None for a layer it does not know (the caller then runs a forward)."""
    h = w = size
    for layer in body.children():
        if isinstance(layer, nn.Conv2d) and isinstance(layer.padding, tuple):
            channels = layer.out_channels
            h, w = (_out(n, layer.kernel_size[i], layer.stride[i], layer.padding[i],
                         layer.dilation[i], False) for i, n in enumerate((h, w)))
        elif isinstance(layer, nn.MaxPool2d):
            k, st = _pair(layer.kernel_size), _pair(layer.stride or layer.kernel_size)
            p, d = _pair(layer.padding), _pair(layer.dilation)
            h, w = (_out(n, k[i], st[i], p[i], d[i], layer.ceil_mode)
                    for i, n in enumerate((h, w)))
        elif not isinstance(layer, _SAME_SHAPE):
            return None
    return channels * h * w


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return v if isinstance(v, tuple) else (v, v)


def _out(n: int, k: int, stride: int, pad: int, dil: int, ceil: bool) -> int:
    span = n + 2 * pad - dil * (k - 1) - 1
    out = -(-span // stride) + 1 if ceil else span // stride + 1
    if ceil and (out - 1) * stride >= n + pad:  # the last window must start inside
        out -= 1
    return out


class MLPNet(FeatureModel):
    """in → 1024 → 1024 → 128 (features) → C. ``in_features``: flat feature vectors (tabular
    data, embeddings) of that length instead of in_channels × image_size² images."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28,
                 hidden: int = 1024, feature_dim: int = 128, in_features: int | None = None
                 ) -> None:
        super().__init__()
        self.num_classes, self.feature_dim = num_classes, feature_dim
        width = in_channels * image_size * image_size if in_features is None else in_features
        self.body = nn.Sequential(
            nn.Flatten(),
            nn.Linear(width, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, feature_dim), nn.ReLU(),
        )
        self.classifier = nn.Linear(feature_dim, num_classes)

    def forward_features(self, x):
        h = self.body(x)
        return h, self.classifier(h)


class LeNet(FeatureModel):
    """conv(in,16,5)-pool-conv(16,16,5)-pool → flattened conv map (features) → 120 → 84 → C.

    Images smaller than 20 px (8×8 digits) use padding 2 so both convolutions fit.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28) -> None:
        super().__init__()
        pad = 2 if image_size < 20 else 0
        self.num_classes = num_classes
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 16, 5, padding=pad), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 16, 5, padding=pad), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.feature_dim = _flat_dim(self.body, in_channels, image_size)
        self.classifier = nn.Sequential(
            nn.Linear(self.feature_dim, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, num_classes),
        )
        init_weights(self)

    def forward_features(self, x):
        h = self.body(x)
        return h, self.classifier(h)


class WeightNormLinear(nn.Linear):
    """A linear layer with weight normalisation (Salimans & Kingma 2016): row k of the weight
    is ``weight_g[k] · weight[k] / ‖weight[k]‖``. SHOT's classifier (its ``feat_classifier``
    with ``type="wn"``); a subclass of ``nn.Linear``, so it is the hypothesis h that SHOT
    freezes and the layer whose input is a custom model's features. ``weight`` is the
    direction v, ``weight_g`` the norms g (initially ‖v‖, so it starts as a plain Linear)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias)
        if self.weight.is_meta:  # shapes only (io.limits): a meta norm imports torch._dynamo
            self.weight_g = nn.Parameter(torch.empty(out_features, 1, device="meta"))
        else:
            self.weight_g = nn.Parameter(self.weight.detach().norm(dim=1, keepdim=True).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight_g * self.weight / self.weight.norm(dim=1, keepdim=True).clamp_min(1e-12)
        return F.linear(x, w, self.bias)


class LeNetShot(FeatureModel):
    """SHOT's digit network (Liang et al. 2020, code ``digit/network.py``: LeNetBase +
    feat_bottleneck "bn" + feat_classifier "wn"), used for USPS ↔ MNIST.

    x ↦ (x − 0.5) / 0.5 (SHOT normalises the [0, 1] pixels to [−1, 1]; done inside the model
    so every mrtf path feeds it [0, 1] images) → conv(in,20,5)-pool-ReLU →
    conv(20,50,5)-Dropout2d(0.5)-pool-ReLU → flatten (800 at 28 px) → bottleneck Linear 256 →
    BatchNorm1d → Dropout(0.5) = the features (256-d, the input of the head) → weight-normalised
    Linear → C. Initialisation as SHOT's: convolutions PyTorch's default, bottleneck
    Xavier-normal with zero bias, BatchNorm weight N(1, 0.02), head bias zero.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28,
                 bottleneck: int = 256) -> None:
        super().__init__()
        pad = 2 if image_size < 20 else 0
        self.num_classes, self.feature_dim = num_classes, bottleneck
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 20, 5, padding=pad), nn.MaxPool2d(2), nn.ReLU(),
            nn.Conv2d(20, 50, 5, padding=pad), nn.Dropout2d(0.5), nn.MaxPool2d(2), nn.ReLU(),
            nn.Flatten(),
        )
        flat = _flat_dim(self.body, in_channels, image_size)
        self.bottleneck = nn.Sequential(nn.Linear(flat, bottleneck), nn.BatchNorm1d(bottleneck),
                                        nn.Dropout(0.5))
        self.classifier = WeightNormLinear(bottleneck, num_classes)
        if not _on_meta(self):  # as init_weights: nothing to initialise on the meta device
            nn.init.xavier_normal_(self.bottleneck[0].weight)
            nn.init.zeros_(self.bottleneck[0].bias)
            nn.init.normal_(self.bottleneck[1].weight, 1.0, 0.02)
            nn.init.zeros_(self.bottleneck[1].bias)
            nn.init.zeros_(self.classifier.bias)

    def forward_features(self, x):
        h = self.bottleneck(self.body((x - 0.5) / 0.5))
        return h, self.classifier(h)


class ConvNet(FeatureModel):
    """The FedAvg CNN: 3 × conv3×3 (32/64/64) with pooling → flattened features → 128 → C.

    At 32 px this gives the reference's 1,024 features; images under 20 px use padding 1.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28,
                 norm: str = "none") -> None:
        super().__init__()
        pad = 1 if image_size < 20 else 0
        self.num_classes = num_classes
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=pad), norm_layer(norm, 32), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=pad), norm_layer(norm, 64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=pad), norm_layer(norm, 64), nn.ReLU(),
            nn.Flatten(),
        )
        self.feature_dim = _flat_dim(self.body, in_channels, image_size)
        self.classifier = nn.Sequential(
            nn.Linear(self.feature_dim, 128), nn.ReLU(), nn.Linear(128, num_classes)
        )
        init_weights(self)

    def forward_features(self, x):
        h = self.body(x)
        return h, self.classifier(h)


class VGG8(FeatureModel):
    """5 × [conv3×3-norm-ReLU-pool] (64-128-256-512-512) → 512 features → 512 → 512 → C.

    Pooling stops once the map is 1 px wide (small images); a global average pool then gives
    512 features at every image size.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 3, image_size: int = 32,
                 norm: str = "batch", dropout: float = 0.5) -> None:
        super().__init__()
        self.num_classes, self.feature_dim = num_classes, 512
        layers: list[nn.Module] = []
        size, cin = image_size, in_channels
        for cout in (64, 128, 256, 512, 512):
            layers += [nn.Conv2d(cin, cout, 3, padding=1), norm_layer(norm, cout), nn.ReLU()]
            if size >= 2:
                layers.append(nn.MaxPool2d(2))
                size //= 2
            cin = cout
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.body = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(512, 512), nn.ReLU(),
            nn.Dropout(dropout), nn.Linear(512, 512), nn.ReLU(),
            nn.Linear(512, num_classes),
        )
        init_weights(self)

    def forward_features(self, x):
        h = self.body(x)
        return h, self.classifier(h)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, norm: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.n1 = norm_layer(norm, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.n2 = norm_layer(norm, cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), norm_layer(norm, cout)
            )

    def forward(self, x):
        out = torch.relu(self.n1(self.conv1(x)))
        return torch.relu(self.n2(self.conv2(out)) + self.shortcut(x))


class ResNet(FeatureModel):
    """CIFAR-style ResNet-(6n+2), 16/32/64 channels, global pool → 64 features → C."""

    def __init__(self, depth: int = 20, num_classes: int = 10, in_channels: int = 3,
                 image_size: int = 32, norm: str = "batch") -> None:
        super().__init__()
        if (depth - 2) % 6 != 0 or depth < 8:
            raise ValueError(f"ResNet depth must be 6n+2 (8, 14, 20, ...), got {depth}")
        n = (depth - 2) // 6
        self.num_classes, self.feature_dim = num_classes, 64
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1, bias=False), norm_layer(norm, 16), nn.ReLU()
        )
        blocks: list[nn.Module] = []
        cin = 16
        for i, cout in enumerate((16, 32, 64)):
            for j in range(n):
                blocks.append(BasicBlock(cin, cout, 2 if (i > 0 and j == 0) else 1, norm))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(64, num_classes)
        init_weights(self)

    def forward_features(self, x):
        h = self.pool(self.blocks(self.stem(x)))
        return h, self.classifier(h)


class CharLSTM(FeatureModel):
    """Embedding 8 → 2-layer LSTM 256 → last step (features) → C. Input: (B, L) token ids."""

    def __init__(self, num_classes: int = 80, vocab_size: int = 80, embed_dim: int = 8,
                 hidden: int = 256, layers: int = 2) -> None:
        super().__init__()
        self.num_classes, self.feature_dim = num_classes, hidden
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, batch_first=True)
        self.classifier = nn.Linear(hidden, num_classes)

    def forward_features(self, x):
        out, _ = self.lstm(self.embed(x.long()))
        h = out[:, -1]
        return h, self.classifier(h)
