"""Federated evaluation runs: several server methods × seeds on the same splits, with per-round
metrics, plots, a summary and exact resumption.

The engine owns client selection (the same clients for every method of a seed), local training
(FedAvg, FedProx, SCAFFOLD), differential privacy on the uploads (MrTF Sect. 5.5: each client's
update clipped to ``dp_clip`` in L2 norm, then N(0, σ²) added to every coordinate before the
server sees it), evaluation and checkpoints; the server logic is a strategy (methods.py).

Every random draw is seeded from (seed, round, client, purpose), so a run restarted from its
last checkpoint ends with exactly the metrics of an uninterrupted run (wall-clock columns
``seconds`` and ``elapsed`` aside).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mrtf.device import pick_device
from mrtf.errors import InputError, first_line
from mrtf.federated.checkpoints import (  # noqa: F401  (re-exported)
    TrackState,
    _write_text,
    load_checkpoint,
    save_checkpoint,
    track_name,
)
from mrtf.federated.dp import privatize  # noqa: F401  (re-exported)
from mrtf.federated.fairness import (
    LOCAL_METRICS,
    client_accuracies,
    fairness_metrics,
)
from mrtf.federated.local import LocalConfig, accuracy, local_train
from mrtf.federated.methods import (
    SCORES,
    ClientUpdate,
    ServerContext,
    make_strategy,
    sub_seed,
)
from mrtf.federated.run_config import (  # noqa: F401  (re-exported)
    LOCAL_ALGORITHMS,
    RUN_FILES,
    VARIANTS,
    RunConfig,
    load_toml,
    prepare_run,
    to_toml,
)
from mrtf.federated.simulate import Federation
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


def run(cfg: RunConfig, out: str | Path | None = None, resume: bool = False,
        force: bool = False, progress: bool = False, device: str | None = None,
        on_record: Callable[[dict], None] | None = None, halt_after: int | None = None,
        on_warning: Callable[[str], None] | None = None,
        on_updates: Callable[..., None] | None = None) -> RunResult:
    """Run every (seed, method) of ``cfg`` and write the run directory.

    on_record : called with each metrics row as it is written.
    on_warning : called with a strategy's first warning of each (seed, method) track.
    on_updates : called as ``(seed, method, round, start_state, updates, federation)`` with
        each round's client updates as the server sees them (after DP), e.g. to export what
        a pilot party receives.
    halt_after : stop (as if killed) after this many rounds in total have been checkpointed;
        for testing resumption.
    """

    cfg.validate()
    out = Path(out or cfg.out or "")
    if not str(out) or str(out) == ".":
        raise InputError("no output directory: give --out (or 'out' in the config file)")
    feds = {cfg.seeds[0]: prepare_run(cfg, cfg.seeds[0])}  # bad data fails before any write
    _check_target_fits(cfg, feds[cfg.seeds[0]])
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory; choose another --out")
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with locked_dir(out):
            return _run_locked(cfg, out, feds, resume, force, progress, device,
                               _Hooks(None, on_record, on_warning, on_updates), halt_after)
    finally:
        if made and [p.name for p in out.iterdir()] == [RUN_LOCK]:  # refused: leave nothing
            (out / RUN_LOCK).unlink(missing_ok=True)
            out.rmdir()


def _run_locked(cfg: RunConfig, out: Path, feds: dict, resume: bool, force: bool,
                progress: bool, device: str | None, given: _Hooks, halt_after: int | None
                ) -> RunResult:
    """:func:`run` once the run directory is locked."""
    from mrtf.federated.report import render

    resuming = prepare_out(cfg, out, resume, force)
    ckdir = out / "ckpt"
    ckdir.mkdir(exist_ok=True)
    if not resuming:
        _write_text(out / "config.json", json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
        _write_text(out / "config.toml", to_toml(cfg.to_dict()))
    dev = pick_device(device)
    bar = None
    if progress:  # a bar on a terminal, plain lines in a log
        bar = progress_bar(len(cfg.seeds) * len(cfg.methods) * cfg.rounds, "simulate", "round")
    all_records: dict[str, list[dict]] = {}
    counter = {"rounds": 0}
    try:
        for seed in cfg.seeds:
            fed = feds.pop(seed, None) or prepare_run(cfg, seed)
            for method in cfg.methods:
                name = track_name(seed, method)
                hooks = _Hooks(bar, given.on_record, given.on_warning, given.on_updates)
                recs = _run_track(cfg, fed, seed, method, ckdir, name, dev, hooks, counter,
                                  halt_after, all_records, out)
                all_records[name] = recs
                if recs is None:
                    return RunResult(out, _flat(all_records), {})
    finally:
        if bar is not None:
            bar.close()
    records = _flat(all_records)
    _write_metrics_jsonl(out, records)
    summary = render(out, records)
    return RunResult(out, records, summary)


@dataclass
class _Hooks:
    """A track's ways to report: progress bar, metrics rows, the first strategy warning."""

    bar: Any = None
    on_record: Callable[[dict], None] | None = None
    on_warning: Callable[[str], None] | None = None
    on_updates: Callable[..., None] | None = None
    warned: bool = False

    def warn(self, lines: list[str], seed: int) -> None:
        if lines and self.on_warning and not self.warned:
            self.warned = True
            self.on_warning(f"seed {seed}, {lines[0]}")


def _flat(all_records: dict[str, list[dict] | None]) -> list[dict]:
    return [r for recs in all_records.values() if recs for r in recs]


def _write_metrics_jsonl(out: Path, records: list[dict]) -> None:
    _write_text(out / "metrics.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n"
                                               for r in records))


def _check_target_fits(cfg: RunConfig, fed: Federation) -> None:
    from mrtf.models import build_model

    model = build_model(cfg.arch, fed.num_classes, **fed.arch_kwargs).eval()
    try:
        with torch.inference_mode():
            logits = model(fed.target_x[:1])
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        raise InputError(f"target images of shape {tuple(fed.target_x.shape[1:])} do not fit "
                         f"the {cfg.arch} models ({first_line(exc)})") from None
    if logits.shape[-1] != fed.num_classes:
        raise InputError("the target does not fit the source's models")


def _train_clients(cfg: RunConfig, fed: Federation, ts: TrackState, strategy, model,
                   chosen: list[int], rnd: int, seed: int, dev: torch.device
                   ) -> list[ClientUpdate]:
    """One round's client updates (FedAvg/FedProx/SCAFFOLD or the strategy's own), with DP
    clipping and noise applied before the server sees them; updates SCAFFOLD's c in ``ts``."""
    local = cfg.local_config()
    scaffold = cfg.local_algorithm == "scaffold"
    updates: list[ClientUpdate] = []
    delta_c: list[dict[str, torch.Tensor]] = []
    for k in chosen:
        s = sub_seed(seed, rnd, k, "local")
        torch.manual_seed(s)  # dropout and anything else on the global RNG
        idx = torch.from_numpy(fed.parts[k])
        x, y = fed.x[idx], fed.y[idx]
        res = strategy.client_update(rnd, k, model, x, y, local, s)
        if res is None:
            ctrl = None
            if scaffold:
                ck = ts.client_controls.get(k)
                ctrl = {n: ts.control[n] - (ck[n] if ck else 0.0) for n in ts.control}
            res = local_train(model, x, y, fed.num_classes, local, seed=s, device=dev,
                              control=ctrl)
            if scaffold:
                delta_c.append(_scaffold_client(ts, k, model, res.model, local, len(x)))
        state = {n: v.detach().cpu().clone() for n, v in res.model.state_dict().items()}
        if cfg.dp_sigma > 0 or cfg.dp_clip > 0:
            gen = torch.Generator().manual_seed(sub_seed(seed, rnd, k, "dp"))
            state = privatize(ts.global_state, state, cfg.dp_sigma, cfg.dp_clip, gen)
        updates.append(ClientUpdate(k, state, res.n_samples, res.label_counts,
                                    res.train_loss))
    if scaffold and delta_c:
        for n in ts.control:  # c ← c + (1/N) Σ_{k∈S} Δc_k
            ts.control[n] = ts.control[n] + sum(d[n] for d in delta_c) / cfg.clients
    return updates


def _score(ctx, agg, fed: Federation, dev: torch.device) -> dict[str, float | None]:
    """Accuracy on the target of every model and prediction the strategy reports."""
    scores: dict[str, float | None] = dict.fromkeys(SCORES)
    local_tests = fed.test_parts is not None
    # a model is built only where it is used: target accuracy not given by predictions,
    # or the clients' local test parts
    models = {col: ctx.build(st) for col, st in agg.states.items()
              if col not in agg.probs or local_tests}
    for col, model in models.items():
        if col not in agg.probs:
            scores[col] = accuracy(model, fed.target_x, fed.target_y, device=dev)
    y_np = fed.target_y.numpy()
    for col, probs in agg.probs.items():
        scores[col] = float((np.asarray(probs).argmax(1) == y_np).mean())
    if local_tests:
        scores.update(_local_scores(models, agg.primary, fed, dev))
    return scores


def _local_scores(models: dict, primary: str, fed: Federation, dev: torch.device
                  ) -> dict[str, float | None]:
    """FedKF's AMP / FM / WLP of every model on the clients' local test parts: ``amp`` etc.
    for the method's own model, ``amp_<column>`` for each model scored (e.g. OCA and ACA)."""
    sizes = np.array([len(a) + len(b) for a, b in zip(fed.parts, fed.test_parts)])
    out: dict[str, float | None] = {}
    for col, model in models.items():
        accs = client_accuracies(model, fed.x, fed.y, fed.test_parts, dev)
        for name, value in fairness_metrics(accs, sizes).items():
            out[f"{name}_{col}"] = value
    for name in LOCAL_METRICS:
        out[name] = out.get(f"{name}_{primary}")
    return out


def _run_track(cfg: RunConfig, fed: Federation, seed: int, method: str, ckdir: Path,
               name: str, dev: torch.device, hooks: _Hooks, counter: dict,
               halt_after: int | None, all_records: dict, out: Path) -> list[dict] | None:
    from mrtf.io.hdf5 import ArraySource
    from mrtf.models import build_model

    c, h, w = fed.x.shape[1:]
    sizes = [len(p) for p in fed.parts]
    ctx = ServerContext(arch=cfg.arch, num_classes=fed.num_classes,
                        arch_kwargs=fed.arch_kwargs, image_shape=(int(c), int(h), int(w)),
                        target=ArraySource(fed.target_x.numpy()), client_sizes=sizes,
                        seed=seed, device=dev, settings=cfg.settings())
    strategy = make_strategy(method, ctx)
    sim = cfg.simulation(seed)
    scaffold = cfg.local_algorithm == "scaffold"
    torch.manual_seed(seed)  # the same initial model for every method of this seed
    model = build_model(cfg.arch, fed.num_classes, **fed.arch_kwargs)
    ts = load_checkpoint(ckdir, name, strategy)
    bar = hooks.bar
    if ts is None:
        init = {k: v.detach().clone() for k, v in model.state_dict().items()}
        strategy.initialize(init)
        control = {k: torch.zeros_like(p) for k, p in model.named_parameters()} \
            if scaffold else None
        ts = TrackState(0, init, control, {}, [], 0.0)
    if bar is not None:
        bar.update(ts.round)
        bar.set_description(f"seed {seed} {method}")
    if ts.done:
        return ts.records
    for rnd in range(ts.round, cfg.rounds):
        t0 = time.perf_counter()
        chosen = sorted(np.random.default_rng([seed, rnd, 17]).choice(
            cfg.clients, size=sim.per_round, replace=False).tolist())
        model.load_state_dict(ts.global_state)
        start_state = ts.global_state
        updates = _train_clients(cfg, fed, ts, strategy, model, chosen, rnd, seed, dev)
        if hooks.on_updates:
            hooks.on_updates(seed, method, rnd, start_state, updates, fed)
        evaluate = (rnd + 1) % cfg.eval_every == 0 or rnd == cfg.rounds - 1
        agg = strategy.aggregate(rnd, ts.global_state, updates, evaluate)
        hooks.warn(agg.warnings, seed)
        ts.global_state = {k: v.detach().cpu().clone() for k, v in agg.state.items()}
        ts.round = rnd + 1
        seconds = time.perf_counter() - t0
        ts.elapsed += seconds
        losses = [u.train_loss for u in updates if np.isfinite(u.train_loss)]
        if evaluate:
            scores = _score(ctx, agg, fed, dev)
            rec = {"seed": seed, "method": method, "round": rnd + 1,
                   "accuracy": scores[agg.primary], **scores,
                   "local_loss": float(np.mean(losses)) if losses else None,
                   "seconds": round(seconds, 4), "elapsed": round(ts.elapsed, 4)}
            ts.records.append(rec)
            ts.done = ts.round == cfg.rounds
            save_checkpoint(ckdir, name, ts, strategy)
            all_records[name] = ts.records
            _write_metrics_jsonl(out, _flat(all_records))
            if hooks.on_record:
                hooks.on_record(rec)
            if bar is not None:
                bar.set_postfix(round=rnd + 1, accuracy=f"{rec['accuracy']:.4f}", refresh=False)
        if bar is not None:
            bar.update(1)
        counter["rounds"] += 1
        if halt_after is not None and counter["rounds"] >= halt_after and not ts.done:
            return None
    return ts.records


def _scaffold_client(ts: TrackState, k: int, start: torch.nn.Module, trained: torch.nn.Module,
                     local: LocalConfig, n: int) -> dict[str, torch.Tensor]:
    """SCAFFOLD option II: c_k⁺ = c_k − c + (θ_t − θ_k)/(K_steps·η_eff); returns Δc_k.

    η_eff = lr / (1 − momentum): with heavy-ball momentum the local SGD moves about that far
    per unit gradient, and dividing by the bare lr overstates the gradient (×10 at 0.9), which
    makes the control variates blow up."""
    batch = min(local.batch_size, n)
    steps = local.steps or local.epochs * max(1, int(np.ceil(n / batch)))
    eff_lr = local.lr / (1.0 - local.momentum)
    start_p = dict(start.named_parameters())
    new_p = dict(trained.named_parameters())
    old = ts.client_controls.get(k) or {n_: torch.zeros_like(v) for n_, v in ts.control.items()}
    new = {n_: (old[n_] - ts.control[n_] + (start_p[n_].detach().cpu()
                                          - new_p[n_].detach().cpu()) / (steps * eff_lr))
           for n_ in ts.control}
    ts.client_controls[k] = new
    return {n_: new[n_] - old[n_] for n_ in new}

