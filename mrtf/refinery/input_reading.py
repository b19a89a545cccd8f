"""Input alignment: the reading of the target the parties understand best (issue 32).

The parties' images and the pilot party's may be prepared differently. MNIST size-normalises
each digit to a 20×20 box centred in its 28×28 frame, while USPS's 16×16 digits fill their
frame, so resized to 28×28 they are ~40 % larger than any MNIST digit; MNIST-M draws MNIST's
digits as colour differences over natural-image patches, where MNIST has white strokes on
black. Networks trained on one preparation misread the other, and adaptation on the target
recovers only part of it (docs/benchmarks/standard-digits.md, input-reading.md).

The pilot party cannot see how the parties prepared their data, but it can ask their models.
On a sample of the target, each reading of :data:`READINGS` (mrtf.io.reading: a shrink by
one of :data:`SCALES`, each with and without the foreground contrast) is scored by the
information the kept parties' mean prediction p̄ carries about the target,
I(p̄) = H(mean p̄) − mean H(p̄): the mutual information between inputs and predictions that
SHOT maximises on the target by training (SHOT, Eq. 2-4, its L_ent + L_div), read here off
the parties as they are. A reading that makes every image look like one class scores low, as
does one that leaves them unsure. The target as given keeps unless another reading leads it
by more than the tie, ``TIE`` × ln C (adapt_start.py's). No label is read.

The whole refinement then reads the target that way: the teachers, the adaptation, the
distillation and the labels (one label per original sample, in order). The refined model's
file says the reading (``mrtf.input_reading``), so ``mrtf label`` reads new data the same way.

Enlarged (:data:`ENLARGEMENTS`) only where the target as given is not new to the parties
(:func:`new_as_given`, the adaptive default's own novelty reading, novelty.py, on the search's
sample). MNIST's digits fill 20 of its 28 pixels, USPS's and scikit-learn's their whole frame:
parties trained on those read MNIST best enlarged about 1.4× (28 / 20), which loses only the
empty border. But an enlarged target also reads as the parties' own, and where it really is
new to them (parties with BatchNorm, SHOT's source recipe, on USPS → MNIST: their features
shifted) the vote-or-adapt choice then votes where adapting was called for: 0.930-0.940
against 0.982-0.984 as given. Where the target as given is like their data (the project's
plain LeNets, whose vote is distilled either way), enlarging gave better labels on 20 of 21
sets (docs/benchmarks/input-reading.md, "Enlarging where the parties vote").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from mrtf.errors import InputError
from mrtf.io.hdf5 import ArraySource
from mrtf.io.reading import Reading, ReadSource, is_image_shape
from mrtf.refinery.adapt_start import TIE, label_information
from mrtf.refinery.feature_shift import feature_shift
from mrtf.refinery.novelty import target_novelty
from mrtf.refinery.teachers import teacher_logits

#: the zoom factors tried: as given, or shrunk down to 0.6 (a digit that fills a 28-pixel
#: frame then spans MNIST's 17 pixels)
SCALES = (0.6, 0.7, 0.8, 0.9, 1.0)
#: every reading tried: each factor, as given and as foreground contrast
READINGS = tuple(Reading(s, fg) for fg in (False, True) for s in SCALES)
#: the enlargements tried too, kept only where the target as given is not new to the parties
#: (the module docstring); 1.4 makes MNIST's 20-pixel digits fill the frame
ENLARGEMENTS = tuple(Reading(s, fg) for fg in (False, True) for s in (1.2, 1.4))
#: the sample the readings are scored on: at most this many target images ...
SAMPLE = 2000
#: ... and at most this many forward passes per reading over all parties (K parties read
#: ``FORWARDS // K`` images each, at least :data:`MIN_SAMPLE`)
FORWARDS = 20_000
MIN_SAMPLE = 256
#: the ``--input-reading`` words (else a reading: FACTOR, fg or fg:FACTOR)
MODES = ("auto", "search", "off")


def parse_input_reading(value: str) -> str | Reading:
    """``'auto'``, ``'search'``, ``'off'``, or a :class:`Reading`; ValueError otherwise."""
    text = str(value).strip().lower()
    if text in MODES:
        return text
    try:
        return Reading.parse(text)
    except ValueError as exc:
        raise ValueError(f"input reading must be one of {', '.join(MODES)} or a reading: "
                         f"{exc}") from None


@dataclass(frozen=True)
class ReadingChoice:
    """The reading of the target kept, and why.

    reading : how the target's images are read (``Reading()``: as given).
    information : reading spec → I(p̄) in nats on the sample (empty when no search ran).
    sample : how many target images were scored.
    reason : 'searched' (the best reading, or as given on a tie), 'given'
        (``--input-reading``) or 'not images' (the search applies to (C, H, W) samples).
    declined : the enlargement that informed the parties more but was not kept, the target
        as given being new to them (:func:`new_as_given`); None otherwise.
    """

    reading: Reading
    information: Mapping[str, float] = field(default_factory=dict)
    sample: int = 0
    reason: str = "searched"
    declined: Reading | None = None

    @property
    def changed(self) -> bool:
        return not self.reading.as_given

    def line(self) -> str:
        """One line for the run's notes."""
        if self.reason == "given":
            return f"the target is read {self.reading.describe()} (--input-reading)"
        if self.reason == "not images":
            return "input reading: not searched (the samples are not images)"
        at, given = self.information, Reading().spec()
        if not self.changed:
            line = (f"the target is read as given: no other reading informs the parties "
                    f"more (information {at[given]:.3f} nats on {self.sample} images)")
        else:
            line = (f"the target is read {self.reading.describe()}: the parties' predictions "
                    f"carry the most information that way ({at[self.reading.spec()]:.3f} nats "
                    f"against {at[given]:.3f} as given, on {self.sample} images)")
        if self.declined is None:
            return line
        return (f"{line}; read {self.declined.describe()} they would carry "
                f"{at[self.declined.spec()]:.3f}, but the target as given is new to them, "
                "and enlarged it would read as theirs (vote, where adapting is called for)")

    def to_dict(self) -> dict[str, Any]:
        return {"reading": self.reading.spec(), "scale": self.reading.scale,
                "foreground": self.reading.foreground, "reason": self.reason,
                "sample": self.sample, "information": dict(self.information),
                "declined": None if self.declined is None else self.declined.spec()}


def sample_rows(m_total: int, parties: int, seed: int) -> np.ndarray:
    """The sorted target rows the readings are scored on (seeded; all rows of a small set)."""
    n = min(m_total, SAMPLE, max(MIN_SAMPLE, FORWARDS // max(parties, 1)))
    if n == m_total:
        return np.arange(m_total)
    return np.sort(np.random.default_rng(seed).choice(m_total, n, replace=False))


def information_of(parties: Sequence[nn.Module], x: np.ndarray,
                   device: torch.device | str | None = None) -> float:
    """I(p̄) in nats of the parties' mean softmax on the images ``x``."""
    return _information(teacher_logits(parties, ArraySource(x), device=device).logits)


def _information(logits: np.ndarray) -> float:
    probs = torch.softmax(torch.from_numpy(logits).double(), dim=2).mean(0)
    return label_information(probs.numpy())


@dataclass(frozen=True)
class _Scored:
    """The search's sample ``x``, each reading's information on it, and the parties' logits
    on it as given (what :func:`new_as_given` reads again)."""

    x: np.ndarray
    information: dict[Reading, float]
    given_logits: np.ndarray


def _score(parties: Sequence[nn.Module], source: Any, seed: int,
           device: torch.device | str | None, readings: Sequence[Reading]) -> _Scored:
    x = source.take(sample_rows(len(source), len(parties), seed))
    information, given_logits = {}, None
    for r in dict.fromkeys([Reading(), *readings]):
        logits = teacher_logits(parties, ArraySource(r.apply(x)), device=device).logits
        information[r] = _information(logits)
        if r.as_given:
            given_logits = logits
    return _Scored(x, information, given_logits)


def _choice(scored: _Scored, num_classes: int) -> ReadingChoice:
    return ReadingChoice(kept_reading(scored.information, num_classes),
                         {r.spec(): v for r, v in scored.information.items()}, len(scored.x))


def choose_reading(parties: Sequence[nn.Module], source: Any, num_classes: int, seed: int = 0,
                   device: torch.device | str | None = None,
                   readings: Sequence[Reading] = READINGS) -> ReadingChoice:
    """The reading of ``readings`` under which the parties' mean prediction carries the most
    information about a sample of ``source`` (as given on a tie; the module docstring)."""
    if not is_image_shape(tuple(source.sample_shape)):
        return ReadingChoice(Reading(), reason="not images")
    return _choice(_score(parties, source, seed, device, readings), num_classes)


def kept_reading(scored: Mapping[Reading, float], num_classes: int,
                 among: Sequence[Reading] | None = None) -> Reading:
    """The reading of ``among`` (default: all scored) whose information leads the target as
    given by more than the tie, the most informative; else as given."""
    given = Reading()
    pool = [r for r in scored if among is None or r in among or r == given]
    best = max(pool, key=scored.__getitem__)
    tie = TIE * float(np.log(max(num_classes, 2)))
    return best if scored[best] - scored[given] > tie else given


def new_as_given(parties: Sequence[nn.Module], x: np.ndarray, logits: np.ndarray,
                 train_losses: Sequence[float | None],
                 device: torch.device | str | None = None) -> bool:
    """Whether the target's images ``x``, as given, are new to the parties by the adaptive
    default's reading (novelty.py: their entropy, from their ``logits`` on ``x``, against the
    losses they claim, and for networks with BatchNorm the shift of their features), on the
    search's sample."""
    shift = feature_shift(parties, ArraySource(x), device or "cpu")
    return target_novelty(logits, train_losses, shift=shift).adapt


def search_with_enlargements(parties: Sequence[nn.Module], source: Any, num_classes: int,
                             train_losses: Sequence[float | None], seed: int = 0,
                             device: torch.device | str | None = None) -> ReadingChoice:
    """:func:`choose_reading` over :data:`READINGS` and :data:`ENLARGEMENTS`; an enlargement
    kept only where the target as given is not new to the parties (the module docstring),
    else the best of :data:`READINGS`, the enlargement named as declined. One pass of the
    parties per reading: the novelty reads the as-given logits of the search."""
    if not is_image_shape(tuple(source.sample_shape)):
        return ReadingChoice(Reading(), reason="not images")
    scored = _score(parties, source, seed, device, READINGS + ENLARGEMENTS)
    choice = _choice(scored, num_classes)
    if choice.reading.scale <= 1.0 or not new_as_given(parties, scored.x, scored.given_logits,
                                                       train_losses, device):
        return choice
    return replace(choice, reading=kept_reading(scored.information, num_classes, READINGS),
                   declined=choice.reading)


def align_input(state: Any) -> None:
    """The pipeline's input alignment (stage 2, before the party checks, so that they, the
    teachers and the fit all read the target one way): the reading as the config and the
    method ask, scored on every planned party, and ``state.source`` read that way; the
    run's notes say it (plan.notes_on_inputs)."""
    mode = parse_input_reading(state.config.input_reading)
    if mode == "auto":
        mode = "search" if state.method.aligns_input else "off"
    if mode == "off":
        return
    if mode == "search":
        choice = search_with_enlargements(
            state.plan.locals_, state.source, state.received.num_classes,
            [m.meta.train_loss for m in state.plan.locals_received], state.config.seed,
            state.dev)
    elif not is_image_shape(tuple(state.source.sample_shape)):
        raise InputError(f"--input-reading {mode.spec()} applies to images (channels, height, "
                         f"width of 8 pixels or more); the target's samples are "
                         f"{tuple(state.source.sample_shape)}")
    else:
        choice = ReadingChoice(mode, reason="given")
    state.input_reading = choice
    if choice.changed:
        state.source = ReadSource(state.source, choice.reading)
