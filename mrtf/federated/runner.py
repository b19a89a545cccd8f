"""Federated evaluation runs: several server methods × seeds on the same splits, with per-round
metrics, plots, a summary and exact resumption, in a run directory.

Each (seed, method) track is a run of the round engine (engine.py); what this module adds is
the run directory and the listeners that write into it: metrics rows, checkpoints (a run
restarted from its last checkpoint ends with exactly the metrics of an uninterrupted run,
wall-clock columns ``seconds`` and ``elapsed`` aside), progress and warnings.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from mrtf.device import pick_device
from mrtf.errors import InputError
from mrtf.federated.checkpoints import (
    _write_text,
    load_checkpoint,
    save_checkpoint,
    track_name,
)
from mrtf.federated.engine import RoundEvent, RoundListener
from mrtf.federated.federation import check_target_fits
from mrtf.federated.run_config import (  # noqa: F401  (re-exported)
    LOCAL_ALGORITHMS,
    RUN_FILES,
    VARIANTS,
    RunConfig,
    load_toml,
    prepare_run,
    to_toml,
)
from mrtf.federated.simulate import build_engine
from mrtf.federated.strategies.dp import privatize  # noqa: F401  (re-exported)
from mrtf.io.atomic import is_temp_name
from mrtf.io.outputs import RUN_LOCK, locked_dir
from mrtf.progress import bar as progress_bar

# ---------------------------------------------------------------- the engine


@dataclass
class RunResult:
    out: Path
    records: list[dict]
    summary: dict[str, dict[str, float]]


def prepare_out(cfg: RunConfig, out: Path, resume: bool, force: bool) -> bool:
    """Check the run directory; returns True when resuming an existing run. A directory holding
    a different run (or other files) is refused unless ``force`` (which replaces our files)."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory")
    existing = out / "config.json"
    if resume and existing.is_file():
        try:
            old = json.loads(existing.read_text())
        except ValueError:
            raise InputError(f"{existing} is unreadable; rerun with --force") from None
        old.pop("out", None)
        # keys added in later versions read as their defaults, so older runs still resume
        old = {**{f.name: f.default for f in fields(RunConfig) if f.name in cfg.identity()
                  and f.default is not MISSING}, **old}
        if old != json.loads(json.dumps(cfg.identity())):
            diff = sorted(k for k in set(old) | set(cfg.identity())
                          if old.get(k) != json.loads(json.dumps(cfg.identity().get(k))))
            raise InputError(f"{out} holds a different run (differs in {', '.join(diff[:3])}); "
                             "use the same settings with --resume, or --force to replace it")
        return True
    if out.exists():
        # temporary files of a killed earlier run are ours: removed, never a reason to refuse
        for stray in out.iterdir():
            if is_temp_name(stray.name) and stray.is_file() and not stray.is_symlink():
                stray.unlink(missing_ok=True)
    if out.exists() and any(p.name != RUN_LOCK for p in out.iterdir()):
        if not force:
            raise InputError(f"{out} is not empty; choose a new directory, --resume a run "
                             "there, or pass --force to replace it")
        ours = set(RUN_FILES) | {"ckpt"}
        others = [p.name for p in out.iterdir() if p.name not in ours | {RUN_LOCK}]
        if others:
            raise InputError(f"{out} holds files that are not a run's ({others[0]}, ...); "
                             "refusing to replace it")
        for name in ours:
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    return False


@dataclass(frozen=True)
class RunHooks:
    """What a caller of :func:`run` is told as the run goes.

    on_record : called with each metrics row as it is written.
    on_warning : called with a strategy's first warning of each (seed, method) track.
    listeners : called at the end of every round of every track (after the run's own), e.g.
        :class:`~mrtf.federated.simulate.ExportReceived` to export what a pilot party receives.
    halt_after : stop (as if killed) after this many rounds in total have been checkpointed;
        for testing resumption.
    """

    on_record: Callable[[dict], None] | None = None
    on_warning: Callable[[str], None] | None = None
    listeners: Sequence[RoundListener] = ()
    halt_after: int | None = None


def run(cfg: RunConfig, out: str | Path | None = None, resume: bool = False,
        force: bool = False, progress: bool = False, device: str | None = None,
        hooks: RunHooks | None = None) -> RunResult:
    """Run every (seed, method) of ``cfg`` and write the run directory, telling ``hooks``
    (:class:`RunHooks`) as it goes."""

    cfg.validate()
    out = Path(out or cfg.out or "")
    if not str(out) or str(out) == ".":
        raise InputError("no output directory: give --out (or 'out' in the config file)")
    feds = {cfg.seeds[0]: prepare_run(cfg, cfg.seeds[0])}  # bad data fails before any write
    check_target_fits(feds[cfg.seeds[0]], cfg.arch)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory; choose another --out")
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with locked_dir(out):
            resuming = prepare_out(cfg, out, resume, force)
            return _run_locked(cfg, out, feds, resuming, progress, device, hooks or RunHooks())
    finally:
        if made and [p.name for p in out.iterdir()] == [RUN_LOCK]:  # refused: leave nothing
            (out / RUN_LOCK).unlink(missing_ok=True)
            out.rmdir()


class _Halt(Exception):
    """Raised by the halt listener: the run stops as if killed (tests of resumption)."""


def _run_locked(cfg: RunConfig, out: Path, feds: dict, resuming: bool, progress: bool,
                device: str | None, given: RunHooks) -> RunResult:
    """:func:`run` once the run directory is locked (and checked: ``resuming`` or new)."""
    from mrtf.federated.report import render

    ckdir = out / "ckpt"
    ckdir.mkdir(exist_ok=True)
    if not resuming:
        _write_text(out / "config.json", json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
        _write_text(out / "config.toml", to_toml(cfg.to_dict()))
    dev = pick_device(device)
    bar = None
    if progress:  # a bar on a terminal, plain lines in a log
        bar = progress_bar(len(cfg.seeds) * len(cfg.methods) * cfg.rounds, "simulate", "round")
    metrics = _MetricsFile(out)
    halt = _HaltAfter(given.halt_after)
    try:
        for seed in cfg.seeds:
            fed = feds.pop(seed, None) or prepare_run(cfg, seed)
            for method in cfg.methods:
                name = track_name(seed, method)
                engine = build_engine(cfg, fed, seed, method, dev)
                engine.listeners = [_Checkpointer(ckdir, name, engine.strategy, engine.client),
                                    metrics, _Report(given.on_record, given.on_warning, bar),
                                    *given.listeners, halt]
                ts = load_checkpoint(ckdir, name, engine.strategy, engine.client)
                if bar is not None:
                    bar.update(ts.round if ts else 0)
                    bar.set_description(f"seed {seed} {method}")
                if ts is not None and ts.done:
                    metrics.records[name] = ts.records
                    continue
                metrics.records[name] = ts.records if ts else []
                engine.run(ts)
    except _Halt:
        return RunResult(out, metrics.flat(), {})
    finally:
        if bar is not None:
            bar.close()
    records = metrics.flat()
    metrics.write()
    summary = render(out, records)
    return RunResult(out, records, summary)


class _MetricsFile:
    """Listener: every track's rows so far, rewritten to ``metrics.jsonl`` after each row."""

    def __init__(self, out: Path) -> None:
        self.out, self.records = out, {}

    def on_round_end(self, event: RoundEvent) -> None:
        if event.record is not None:
            self.records[track_name(event.seed, event.method)] = event.state.records
            self.write()

    def flat(self) -> list[dict]:
        return [r for recs in self.records.values() if recs for r in recs]

    def write(self) -> None:
        _write_text(self.out / "metrics.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n"
                                                        for r in self.flat()))


class _Checkpointer:
    """Listener: a checkpoint after every evaluated round (the metrics row is its commit)."""

    def __init__(self, ckdir: Path, name: str, strategy, client) -> None:
        self.ckdir, self.name, self.strategy, self.client = ckdir, name, strategy, client

    def on_round_end(self, event: RoundEvent) -> None:
        if event.record is not None:
            save_checkpoint(self.ckdir, self.name, event.state, self.strategy, self.client)


@dataclass
class _Report:
    """Listener: metrics rows to the caller, the first strategy warning of a track, the bar."""

    on_record: Callable[[dict], None] | None
    on_warning: Callable[[str], None] | None
    bar: Any = None
    warned: bool = False

    def on_round_end(self, event: RoundEvent) -> None:
        lines = event.aggregated.warnings
        if lines and self.on_warning and not self.warned:
            self.warned = True
            self.on_warning(f"seed {event.seed}, {lines[0]}")
        rec = event.record
        if rec is not None and self.on_record:
            self.on_record(rec)
        if self.bar is not None:
            if rec is not None:
                self.bar.set_postfix(round=rec["round"], accuracy=f"{rec['accuracy']:.4f}",
                                     refresh=False)
            self.bar.update(1)


class _HaltAfter:
    """Listener: stop the run after ``limit`` rounds in total (None: never)."""

    def __init__(self, limit: int | None) -> None:
        self.limit, self.rounds = limit, 0

    def on_round_end(self, event: RoundEvent) -> None:
        self.rounds += 1
        if self.limit is not None and self.rounds >= self.limit and not event.state.done:
            raise _Halt
