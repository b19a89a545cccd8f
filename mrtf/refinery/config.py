"""What a refinement is asked to do: :class:`RefineConfig`, checked against the registered
methods (registry.py; ``METHODS`` and ``METHOD_SPECS`` are read from there)."""

from __future__ import annotations

from dataclasses import dataclass

from mrtf.averaging import parse_aggregate
from mrtf.errors import InputError
from mrtf.refinery.augment import DEFAULT_JITTER, Jitter
from mrtf.refinery.distill import BATCH_SIZE, STEPS, DistillRun
from mrtf.refinery.fastpath import PRECISIONS
from mrtf.refinery.input_reading import parse_input_reading
from mrtf.refinery.neighbour_vote import NEIGHBOURS, check_neighbours
from mrtf.refinery.prior_choice import CLASS_PRIORS
from mrtf.refinery.registry import METHOD_SPECS, METHODS, MethodOptions, get_method
from mrtf.refinery.teachers import STACK_MODES
from mrtf.refinery.variants import VARIANTS
from mrtf.trust.class_frequencies import check_class_frequencies, normalised

#: MrTF's clustered label refinery is skipped for models of the first rounds (the default
#: of RefineConfig, of the simulator's refinery methods and of the Flower config)
CLR_MIN_ROUND = 5
#: The reference code normalises logits per inference batch (320-640 samples): we use 512.
REF_STD_BATCH = 512
STREAM_MODES = ("auto", "on", "off")


@dataclass
class RefineConfig:
    """Refinement settings (defaults: MrTF paper, Sect. 4-5).

    method : adaptive (default: every source weighted by its measured trust, adaptive.py) |
        fedavg (θ_{t+1}, no distillation) | feddf (AvgLogit, Eq. 3) | st (stabilized AvgProb,
        Eq. 6-7) | st+rd (+ rectified targets, Eq. 10) | mrtf (+ clustered label refinery,
        Eq. 11-12): see METHOD_SPECS.
    variant : 'paper' or 'reference' (the authors' code, docs/reference-code.md): Eq. 6's
        std and the distillation settings, for every method (adaptive was chosen with
        'paper', its default).
    lr : None → variant default (paper 3e-4, reference 1e-3).
    clr_min_round : (mrtf only) skip CLR for models of the first ``clr_min_round`` rounds
        (``BundleMeta.round`` < it; 0-based in memory, files count from 1): the paper skips
        the first 5 rounds, when θ_{t+1}'s features are not yet discriminative (Sect. 4.3);
        0 = always apply. Models without a round always get CLR.
    class_prior : (adaptive only) 'auto' (default: the consensus is formed under both priors
        below and the one whose labels follow the target's own neighbourhoods better than
        chance by more is kept, prior_choice.py), 'learned' (the consensus learns the
        target's class frequencies) or
        'uniform' (each source's class bias is divided out first: better labels on balanced
        targets, worse on skewed ones; adaptive.debias has the numbers).
    trust : measure every party on the target set (mrtf.trust.reliability) and leave the
        excluded ones out of the parameter average and the teachers, down-weight the doubtful
        ones, cap claimed n_samples. None (default) = on for adaptive, off for the paper's
        methods (they reproduce the paper, which has no defence).
    aggregate : the parameter average θ_{t+1}: 'mean' (weighted by n_samples, the paper),
        'median' (coordinate-wise) or 'trimmed:β' (coordinate-wise trimmed mean), see
        mrtf.averaging.aggregate_states.
    stream : 'auto' (spill the whole-target arrays to scratch files, storage.py, when in
        memory they would hold more than ~768 MB), 'on' or 'off'. Same labels either way.
    scratch_dir : where streaming puts its scratch folder (removed at the end); None = the
        system's temporary folder. The CLI uses the labels file's folder.
    neighbour_vote : (adaptive only) k of the labels' neighbour vote: each label is the
        refined model's softmax summed over the sample and its k nearest target samples in
        the model's feature space (neighbour_vote.py; +0.9 / +1.0 points on the grid / fresh
        sets at k = 3); 0 = the model's own argmax.
    augment : (adaptive only) jitter the student's image inputs while it distils: shifts up
        to 2/28 of the side and rotations up to 10° (augment.py; +0.9 / +0.5 points on the grid
        / fresh sets). False = distil the clean images only.
    precision : the teachers' pass in 'fp32' (default) or 'bf16' (bfloat16: faster on GPUs and
        CPUs with bf16 units, labels from slightly different logits; the run notes the
        argmax agreement with fp32 on the first chunk; precision.py).
    input_reading : how the target's images are read (input_reading.py): 'auto' (default:
        the method's choice; the adaptive default searches, the paper's methods and the
        baselines read the target as given), 'search' (any method: the reading of
        input_reading.READINGS under which the parties' mean prediction is most
        informative), 'off' (as given) or a reading: a zoom factor in [0.5, 2] ('0.7'), the
        foreground contrast ('fg') or both ('fg:0.7').
    class_frequencies : the target's class frequencies, one number per class (shares or
        counts), when known. They replace the even spread the default otherwise assumes:
        the consensus divides each model's class bias out toward them (adaptive.py,
        "given" in place of "uniform"), the diversity terms of SHOT, NRC and DECISION pull
        the adapted models' mean prediction to them (``class_prior`` of ShotSettings,
        NrcSettings, DecisionSettings; prior_diversity.py), the adapted labels' spread is
        checked against them (branch_choice.collapsed_adaptation), and the label-free
        estimate reads the labels' spread against them (mrtf.trust.class_frequencies).
        The other methods' labels have no class prior (``Method.takes_class_frequencies``
        False): the run says so in a note. None (default): an even spread.
    method_options : the method's own settings for this run, an instance of the type of its
        registered defaults (``Method.settings``: shot ``ShotSettings``, aad ``AadSettings``,
        nrc ``NrcSettings``, decision ``DecisionSettings``), e.g.
        ``RefineConfig(method="decision", method_options=DecisionSettings(sample_budget=
        20_000))``; None (default) = the method's defaults. Checked in :meth:`validate`;
        :attr:`options` is what the method runs with. ``mrtf refine --option KEY=VALUE`` sets
        one field (options.py).
    """

    method: str = "adaptive"
    variant: str = "paper"
    tau: float = 4.0
    steps: int = STEPS
    batch_size: int = BATCH_SIZE
    lr: float | None = None
    clr_iterations: int = 1
    clr_min_round: int = CLR_MIN_ROUND
    seed: int = 0
    device: str | None = None
    progress: bool = True
    inference_batch: int = 1024
    stack: str = "auto"
    precision: str = "fp32"
    class_prior: str = "auto"
    trust: bool | None = None
    aggregate: str = "mean"
    stream: str = "auto"
    scratch_dir: str | None = None
    neighbour_vote: int = NEIGHBOURS
    augment: bool = True
    input_reading: str = "auto"
    class_frequencies: tuple[float, ...] | None = None
    method_options: MethodOptions | None = None

    @property
    def class_shares(self) -> tuple[float, ...] | None:
        """:attr:`class_frequencies` as shares summing to 1 (each floored above 0), or None."""
        if self.class_frequencies is None:
            return None
        return tuple(float(v) for v in normalised(self.class_frequencies))

    @property
    def vote_k(self) -> int:
        """Neighbours of the labels' vote: ``neighbour_vote`` for a method that votes, else 0."""
        return self.neighbour_vote if get_method(self.method).vote else 0

    @property
    def trust_on(self) -> bool:
        """Whether the party reliability checks run: ``trust``, or the method's default."""
        return get_method(self.method).trust_default if self.trust is None else bool(self.trust)

    @property
    def jitter(self) -> Jitter | None:
        """The student's input jitter: the default for a method that jitters, else None."""
        return DEFAULT_JITTER if self.augment and get_method(self.method).augment else None

    @property
    def options(self) -> MethodOptions | None:
        """The method's own settings for this run: ``method_options``, else the registered
        method's defaults (None for a method without any)."""
        if self.method_options is not None:
            return self.method_options
        return get_method(self.method).settings

    def distill_run(self, seed_offset: int = 0) -> DistillRun:
        """The distillation's schedule: steps, batch, lr, ``seed + seed_offset``, variant, and
        the method's jitter."""
        return DistillRun(self.steps, self.batch_size, self.lr, self.seed + seed_offset,
                          self.variant, self.jitter)

    def validate(self) -> None:
        def bad(cond: bool, msg: str) -> None:
            if cond:
                raise InputError(msg)

        bad(self.method not in METHODS, f"method must be one of {', '.join(METHODS)}, "
            f"got {self.method!r}")
        bad(self.variant not in VARIANTS, f"variant must be paper or reference, got "
            f"{self.variant!r}")
        bad(not self.tau > 0, f"tau must be > 0, got {self.tau}")
        bad(self.steps < 0, f"steps must be >= 0, got {self.steps}")
        bad(self.batch_size < 1, f"batch size must be >= 1, got {self.batch_size}")
        bad(self.lr is not None and not self.lr > 0, f"lr must be > 0, got {self.lr}")
        bad(self.clr_iterations < 0, f"clr iterations must be >= 0, got {self.clr_iterations}")
        bad(self.inference_batch < 1, "inference batch must be >= 1")
        bad(self.stack not in STACK_MODES, f"stack must be one of {STACK_MODES}")
        bad(self.precision not in PRECISIONS, f"precision must be one of "
            f"{', '.join(PRECISIONS)}, got {self.precision!r}")
        bad(self.class_prior not in CLASS_PRIORS, f"class prior must be one of "
            f"{', '.join(CLASS_PRIORS)}, got {self.class_prior!r}")
        takers = [m.name for m in METHOD_SPECS.values() if m.takes_class_prior]
        bad(self.class_prior == "uniform" and self.method not in takers,
            f"--class-prior {self.class_prior} applies to the {' and '.join(takers)} method "
            f"only, not {self.method}")
        try:
            parse_aggregate(self.aggregate)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        check_neighbours(self.neighbour_vote)
        bad(self.stream not in STREAM_MODES, f"stream must be one of {STREAM_MODES}")
        try:
            parse_input_reading(self.input_reading)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        if self.class_frequencies is not None:
            check_class_frequencies(self.class_frequencies)
        bad(self.class_frequencies is not None and self.class_prior != "auto",
            f"--class-frequencies sets the class prior; leave --class-prior at auto (got "
            f"{self.class_prior})")
        self._check_options()

    def check_classes(self, num_classes: int) -> None:
        """InputError when :attr:`class_frequencies` do not give one per class."""
        if self.class_frequencies is not None:
            check_class_frequencies(self.class_frequencies, num_classes)

    def _check_options(self) -> None:
        """``method_options`` of the method's own type, and the options' own checks."""
        own, given = get_method(self.method).settings, self.method_options
        if given is not None and own is None:
            raise InputError(f"method {self.method} takes no method options")
        if given is not None and type(given) is not type(own):
            raise InputError(f"the options of method {self.method} are a "
                             f"{type(own).__name__}, got {type(given).__name__}")
        if self.options is not None:
            self.options.validate()

