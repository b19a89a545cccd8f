"""Non-IID client splits as the papers define them (MrTF Sect. 3.3, docs/reference-code.md).

Specs on the command line: ``iid``, ``label:C̄`` (each client sees exactly C̄ classes) and
``dirichlet:α`` (per-class client proportions drawn from Dir(α)). Every client gets at least
one sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mrtf.errors import InputError


@dataclass(frozen=True)
class SplitSpec:
    """A parsed split: ``kind`` in {iid, label, dirichlet} and its parameter."""

    kind: str
    param: float = 0.0

    def __str__(self) -> str:
        if self.kind == "iid":
            return "iid"
        return f"{self.kind}:{int(self.param) if self.kind == 'label' else self.param:g}"


def parse_split(spec: str) -> SplitSpec:
    """Parse ``iid`` | ``label:C̄`` | ``dirichlet:α``; raises InputError on anything else."""
    text = spec.strip().lower()
    if text == "iid":
        return SplitSpec("iid")
    kind, _, value = text.partition(":")
    if kind in ("label", "dirichlet") and value:
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if kind == "label" and number.is_integer() and number >= 1:
            return SplitSpec("label", int(number))
        if kind == "dirichlet" and np.isfinite(number) and number > 0:
            return SplitSpec("dirichlet", number)
    raise InputError(f"bad split {spec!r}: use iid, label:C (integer C >= 1) or dirichlet:alpha "
                     "(alpha > 0)")


def split_clients(y: np.ndarray, num_clients: int, spec: SplitSpec | str, seed: int,
                  num_classes: int | None = None) -> list[np.ndarray]:
    """Indices of ``y`` for each of ``num_clients`` clients, every client non-empty."""
    spec = parse_split(spec) if isinstance(spec, str) else spec
    y = np.asarray(y)
    num_classes = num_classes or int(y.max()) + 1
    if num_clients < 1:
        raise InputError(f"need at least one client, got {num_clients}")
    if num_clients > len(y):
        raise InputError(f"{num_clients} clients but only {len(y)} samples")
    rng = np.random.default_rng(seed)
    if spec.kind == "iid":
        parts = np.array_split(rng.permutation(len(y)), num_clients)
    elif spec.kind == "label":
        parts = _label_split(y, num_clients, int(spec.param), num_classes, rng)
    else:
        parts = _dirichlet_split(y, num_clients, spec.param, num_classes, rng)
    return [np.sort(p).astype(np.int64) for p in parts]


def _label_split(y: np.ndarray, k: int, cbar: int, c: int, rng: np.random.Generator
                 ) -> list[np.ndarray]:
    """Concatenated random class permutations, client i takes slots [i·C̄, (i+1)·C̄); each
    class is cut into equal chunks over its slots. A permutation whose head would repeat a
    class already in the straddling client's slice is redrawn, so each client sees exactly C̄
    distinct classes (the reference code lets a duplicate slip through)."""
    if cbar > c:
        raise InputError(f"label:{cbar} asks for more classes per client than the {c} there are")
    slots: list[int] = []
    while len(slots) < k * cbar:
        held = slots[len(slots) - len(slots) % cbar:]
        for _ in range(1000):
            perm = rng.permutation(c).tolist()
            if not set(held) & set(perm[:cbar - len(held)]):
                break
        slots += perm
    slots = slots[:k * cbar]
    by_class = [rng.permutation(np.flatnonzero(y == cls)) for cls in range(c)]
    uses = np.bincount(slots, minlength=c)
    cursor = np.zeros(c, dtype=int)
    chunks = [np.array_split(by_class[cls], max(uses[cls], 1)) for cls in range(c)]
    parts: list[list[np.ndarray]] = [[] for _ in range(k)]
    for i, cls in enumerate(slots):
        parts[i // cbar].append(chunks[cls][cursor[cls]])
        cursor[cls] += 1
    out = [np.concatenate(p) for p in parts]
    if any(len(p) == 0 for p in out):
        raise InputError(f"label:{cbar} with {k} clients leaves a client without samples; "
                         "use fewer clients or a larger C")
    return out


def _dirichlet_split(y: np.ndarray, k: int, alpha: float, c: int, rng: np.random.Generator
                     ) -> list[np.ndarray]:
    """A (clients × classes) matrix from Dir(α), normalised per class; each class is cut by
    those proportions. Redrawn (up to 100 times) until no client is empty; after that, empty
    clients take one sample from the largest client."""
    by_class = [np.flatnonzero(y == cls) for cls in range(c)]
    for _ in range(100):
        props = rng.dirichlet(np.full(c, alpha), size=k)  # row k: client k's p_k(y)
        props = props / props.sum(0, keepdims=True)  # normalise per class
        parts: list[list[np.ndarray]] = [[] for _ in range(k)]
        for cls, idx in enumerate(by_class):
            idx = rng.permutation(idx)
            cuts = (np.cumsum(props[:, cls])[:-1] * len(idx)).astype(int)
            for client, piece in enumerate(np.split(idx, cuts)):
                parts[client].append(piece)
        out = [np.concatenate(p) if p else np.empty(0, np.int64) for p in parts]
        if all(len(p) > 0 for p in out):
            return out
    for i in range(k):
        if len(out[i]) == 0:
            big = int(np.argmax([len(p) for p in out]))
            out[i], out[big] = out[big][-1:], out[big][:-1]
    return out


def client_class_counts(y: np.ndarray, parts: list[np.ndarray], num_classes: int
                        ) -> np.ndarray:
    """(clients, classes) matrix of sample counts per client and class."""
    return np.stack([np.bincount(np.asarray(y)[p], minlength=num_classes) for p in parts])
