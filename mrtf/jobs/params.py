"""What the refine job is asked to do: :class:`RefineJob`, one typed object checked once, when
it is made (before any file is opened). ``mrtf refine``'s options build it; a notebook or the
Flower pilot party builds it directly."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from mrtf.averaging import parse_aggregate
from mrtf.errors import InputError
from mrtf.refinery.config import RefineConfig
from mrtf.trust.selective import check_selection

PathLike = str | os.PathLike


@dataclass(frozen=True)
class RefineJob:
    """One refine job: received models (+ unlabeled data) → refined model and labels.

    received : the received-models directory.
    data : the unlabeled target set (.h5 with x); None: data-free fusion (FedFTG / FedKF).
    labels, csv, model : where to write the labels (.h5), the labels as CSV and the refined
        model (.safetensors bundle); at least one. Labels need ``data``.
    config : the refinery's settings (with ``data``); its ``seed``, ``device`` and
        ``progress`` serve data-free fusion too. ``stream`` and ``scratch_dir`` are settled
        by the job (streaming when the run would not fit in memory; scratch beside the
        outputs).
    min_confidence, coverage : selective labeling (not both): leave the least confident
        samples unlabeled (label -1).
    student_arch, student_file : a fresh student architecture, or a model file to start
        from (not both); needed when the parties' architectures differ.
    trust_arch : your own model code (``module:factory``), trusted, for received files that
        name it.
    datafree : without ``data``: force ``fedftg`` or ``fedkf`` (checked by
        mrtf.datafree.choose_method). fusion_steps : without
        ``data``: the student's total steps (None: the method's default).
    dump_samples : without ``data``: write a PNG grid of generated images per class.
    force : replace existing outputs.
    """

    received: PathLike
    data: PathLike | None = None
    labels: PathLike | None = None
    model: PathLike | None = None
    csv: PathLike | None = None
    config: RefineConfig = field(default_factory=RefineConfig)
    min_confidence: float | None = None
    coverage: float | None = None
    student_arch: str | None = None
    student_file: PathLike | None = None
    trust_arch: tuple[str, ...] = ()
    datafree: str | None = None
    fusion_steps: int | None = None
    dump_samples: PathLike | None = None
    force: bool = False

    def __post_init__(self) -> None:
        for name in ("received", "data", "labels", "model", "csv", "student_file",
                     "dump_samples"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))
        object.__setattr__(self, "trust_arch", tuple(self.trust_arch))
        # a private copy: the job settles stream and scratch_dir, the caller's is unchanged
        object.__setattr__(self, "config", dataclasses.replace(self.config))
        self._check_outputs()
        self._check_settings()

    @property
    def with_data(self) -> bool:
        return self.data is not None

    @property
    def outputs(self) -> list[Path | None]:
        """Every file the job may write, in the order they are claimed."""
        return [self.labels, self.model, self.csv, self.dump_samples]

    def _check_outputs(self) -> None:
        if (self.labels is not None or self.csv is not None) and self.data is None:
            raise InputError("--labels needs --data (the samples to label); without --data, "
                             "refine fuses the models data-free and writes only --model")
        if self.labels is None and self.model is None and self.csv is None:
            raise InputError("nothing to write: give --labels, --csv and/or --model")
        if self.data is None and self.dump_samples is None and self.model is None:
            raise InputError("data-free fusion needs --model")
        if self.data is not None and (self.datafree or self.dump_samples):
            raise InputError("--datafree and --dump-samples apply only without --data")

    def _check_settings(self) -> None:
        cfg = self.config
        try:
            parse_aggregate(cfg.aggregate)
        except ValueError as exc:
            raise InputError(f"--aggregate: {exc}") from None
        if self.data is None and (cfg.aggregate != "mean" or cfg.trust):
            raise InputError("--aggregate and --trust apply with --data only")
        check_selection(self.min_confidence, self.coverage)
        cfg.validate()
        if self.data is None and (self.min_confidence is not None or self.coverage is not None
                                  or cfg.class_frequencies is not None):
            raise InputError("--min-confidence, --coverage and --class-frequencies apply with "
                             "--data only")
        if self.student_file is not None and self.student_arch is not None:
            raise InputError("give --student or --student-arch, not both")

    def inputs(self, model_files: list[Path]) -> list[Path | None]:
        """Every input a listed output could clobber: the received files (and their
        sidecars), the data and the student file."""
        return [p for f in model_files for p in (f, f.with_suffix(".json"))] + \
            [self.data, self.student_file]
