"""Render a run directory: metrics.h5, accuracy.png (accuracy vs round per method, with a band
over seeds) and summary.md (final and best-of-last-5 accuracy, mean ± std over seeds)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mrtf.errors import InputError
from mrtf.federated.fairness import LOCAL_METRICS
from mrtf.federated.methods import SCORES
from mrtf.io.atomic import atomic_path

#: models that have weights, hence AMP / FM / WLP on the local test parts (not "ensemble")
MODEL_SCORES = tuple(c for c in SCORES if c != "ensemble")
LOCAL_COLUMNS = (*LOCAL_METRICS, *(f"{m}_{c}" for c in MODEL_SCORES for m in LOCAL_METRICS))
COLUMNS = ("round", "accuracy", *SCORES, "local_loss", "seconds", "elapsed", *LOCAL_COLUMNS)


def load_records(run_dir: str | Path) -> list[dict]:
    p = Path(run_dir) / "metrics.jsonl"
    if not p.is_file():
        raise InputError(f"{run_dir} is not a run directory (no metrics.jsonl)")
    try:
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    except ValueError as exc:
        raise InputError(f"{p}: malformed JSON line ({exc})") from None


def _methods(records: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["method"] for r in records))


def _series(records: list[dict], method: str) -> dict[int, list[dict]]:
    by_seed: dict[int, list[dict]] = {}
    for r in records:
        if r["method"] == method:
            by_seed.setdefault(r["seed"], []).append(r)
    return {s: sorted(rs, key=lambda r: r["round"]) for s, rs in by_seed.items()}


def summarize(records: list[dict]) -> dict[str, dict[str, float]]:
    """Per method: final / best-of-last-5 accuracy (mean, std over seeds), wall seconds."""
    out: dict[str, dict[str, float]] = {}
    for m in _methods(records):
        series = _series(records, m)
        final = [rs[-1]["accuracy"] for rs in series.values()]
        best5 = [max(r["accuracy"] for r in rs[-5:]) for rs in series.values()]
        wall = [rs[-1].get("elapsed") or 0.0 for rs in series.values()]
        out[m] = {"final_mean": float(np.mean(final)), "final_std": float(np.std(final)),
                  "best5_mean": float(np.mean(best5)), "best5_std": float(np.std(best5)),
                  "wall_mean": float(np.mean(wall)), "seeds": len(series),
                  "rounds": int(max(rs[-1]["round"] for rs in series.values()))}
    return out


def _fmt(v) -> str:
    return "–" if v is None else f"{v:.4f}"


def summary_markdown(records: list[dict], config: dict | None = None) -> str:
    summ = summarize(records)
    lines = ["# Federated evaluation run", ""]
    if config:
        keys = ("dataset", "target", "clients", "split", "ratio", "rounds", "epochs",
                "local_steps", "batch_size", "lr", "arch", "local_algorithm",
                "keep_training_on_average", "dp_sigma", "dp_clip")
        lines += ["Setting: " + ", ".join(f"{k}={config.get(k)}" for k in keys
                                           if k in config), ""]
    lines += ["Accuracy on the target set (mean ± std over seeds; best of the last 5 "
              "evaluations per seed).", "",
              "| method | seeds | rounds | final | best of last 5 | wall s |",
              "|---|---|---|---|---|---|"]
    for m, s in summ.items():
        lines.append(f"| {m} | {s['seeds']} | {s['rounds']} | {s['final_mean']:.4f} ± "
                     f"{s['final_std']:.4f} | {s['best5_mean']:.4f} ± {s['best5_std']:.4f} | "
                     f"{s['wall_mean']:.1f} |")
    lines += ["", "Final round per seed (every model scored):", "",
              "| method | seed | round | accuracy | " + " | ".join(SCORES) +
              " | local loss |", "|---" * (5 + len(SCORES)) + "|"]
    for m in summ:
        for seed, rs in _series(records, m).items():
            r = rs[-1]
            lines.append(f"| {m} | {seed} | {r['round']} | {_fmt(r['accuracy'])} | " +
                         " | ".join(_fmt(r.get(c)) for c in SCORES) +
                         f" | {_fmt(r.get('local_loss'))} |")
    return "\n".join(lines + _local_lines(records, summ)) + "\n"


def _local_lines(records: list[dict], summ: dict) -> list[str]:
    """FedKF's AMP / FM / WLP at each seed's final evaluation, mean ± std over seeds, for every
    model that has them (e.g. FedKF's OCA and ACA); nothing when the run has no local tests."""
    rows = []
    for m in summ:
        finals = [rs[-1] for rs in _series(records, m).values()]
        for col in MODEL_SCORES:
            vals = {k: [r.get(f"{k}_{col}") for r in finals] for k in LOCAL_METRICS}
            if any(v is None for v in vals["amp"]):
                continue
            cells = " | ".join(f"{np.mean(vals[k]):.4f} ± {np.std(vals[k]):.4f}"
                               for k in LOCAL_METRICS)
            rows.append(f"| {m} | {col} | {cells} |")
    if not rows:
        return []
    return ["", "Clients' local test parts at the final round (FedKF Def. 1-3; AMP and WLP: "
            "higher is better, FM: variance across clients, lower is fairer), mean ± std over "
            "seeds:", "", "| method | model | AMP | FM | WLP |", "|---|---|---|---|---|", *rows]


def plot_title(config: dict | None) -> str:
    """The setting in two lines: data and split, then federation and training."""
    if not config:
        return "accuracy on the target set"
    data = config.get("dataset", "?")
    if config.get("target") and config.get("target") != data:
        data = f"{data} → {config['target']}"
    first = f"{data}, split {config.get('split')}, K={config.get('clients')}, " \
            f"R={config.get('ratio')}"
    local = f"E={config.get('epochs')}" if not config.get("local_steps") else \
        f"{config.get('local_steps')} local steps"
    second = f"{config.get('arch')}, {local}, batch {config.get('batch_size')}, " \
             f"clients: {config.get('local_algorithm', 'fedavg')}"
    if config.get("keep_training_on_average"):
        second += " on the plain average"
    if config.get("dp_sigma") or config.get("dp_clip"):
        second += f", DP σ={config.get('dp_sigma')} clip={config.get('dp_clip')}"
    return f"{first}\n{second}"


def plot(records: list[dict], path: Path, config: dict | None = None) -> None:
    """accuracy.png: mean accuracy per round and method; with several seeds, a band from the
    lowest to the highest seed (said in the legend). The y-axis spans 0-1 so that a few
    points of noise do not look like a trend; rounds are whole numbers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    n_seeds = 1
    for m in _methods(records):
        series = _series(records, m)
        n_seeds = max(n_seeds, len(series))
        rounds = sorted({r["round"] for rs in series.values() for r in rs})
        acc = np.full((len(series), len(rounds)), np.nan)
        for i, rs in enumerate(series.values()):
            for r in rs:
                acc[i, rounds.index(r["round"])] = r["accuracy"]
        mean = np.nanmean(acc, 0)
        label = m if len(series) == 1 else f"{m} (mean of {len(series)} seeds)"
        line, = ax.plot(rounds, mean, marker="o" if len(rounds) < 20 else None, label=label)
        if len(series) > 1:
            ax.fill_between(rounds, np.nanmin(acc, 0), np.nanmax(acc, 0),
                            color=line.get_color(), alpha=0.2)
    handles, labels = ax.get_legend_handles_labels()
    if n_seeds > 1:
        handles.append(Patch(color="grey", alpha=0.3))
        labels.append("band: lowest to highest seed")
    ax.set_xlabel("round (1 = after the first round)")
    ax.set_ylabel("accuracy on the target set")
    ax.set_ylim(0, 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.set_title(plot_title(config), fontsize=9)
    ax.legend(handles, labels, fontsize=8, loc="best")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def write_h5(records: list[dict], path: Path) -> None:
    """metrics.h5: one dataset per column (NaN where a method has no such model), plus
    ``method`` (strings) and ``seed``."""
    import h5py

    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("method", data=np.array([r["method"] for r in records], dtype="S"))
        f.create_dataset("seed", data=np.array([r["seed"] for r in records], dtype=np.int64))
        for col in COLUMNS:
            vals = [r.get(col) for r in records]
            f.create_dataset(col, data=np.array([np.nan if v is None else v for v in vals],
                                                dtype=np.float64))


def render(run_dir: str | Path, records: list[dict] | None = None) -> dict:
    """(Re)write metrics.h5, accuracy.png and summary.md from metrics.jsonl; returns the
    summary dict."""
    run_dir = Path(run_dir)
    if records is None:
        records = load_records(run_dir)
    if not records:
        raise InputError(f"{run_dir}: metrics.jsonl holds no rows yet")
    cfg_path = run_dir / "config.json"
    config = json.loads(cfg_path.read_text()) if cfg_path.is_file() else None
    write_h5(records, run_dir / "metrics.h5")
    plot(records, run_dir / "accuracy.png", config)
    with atomic_path(run_dir / "summary.md") as tmp:
        tmp.write_text(summary_markdown(records, config))
    return summarize(records)
