"""Refinery stages at scale: wall time per stage and peak RSS vs the target-set size M.

The target set is mnist5k tiled to M rows, uint8 in HDF5 (streamed, as a pilot party's would
be); the K teachers are seeded random-init LeNets (the cost does not depend on the weights).
Every (M, K) cell runs in its own subprocess (clean ru_maxrss) and is cached as one JSON file
under ``--dir``: a cell that finished is never re-run, so a long grid (1M × 50 teachers: tens
of minutes on a loaded 2-core machine) can be stopped and resumed. The tiled HDF5 files are
cached there too. At the end every cached cell goes into one JSON and one plot.

    python bench/scale.py --M 10000 100000 --K 10          # what fits in a few minutes
    python bench/scale.py --M 10000 100000 1000000 --K 10 50

``--e2e`` times the whole ``mrtf refine`` command instead (streaming, issue 14): K LeNet
parties from a one-round ``mrtf simulate`` on mnist5k, the tiled target set, ``--stream
on``; per stage from ``--json`` timings, peak RSS of the command (``ru_maxrss`` of the child),
wall, the load average before and after. Cells ``e2e-M*-K*.json``; ``scale-e2e.json/png``.

    python bench/scale.py --e2e --M 100000 1000000 --K 10 --threads 2

``--compare`` runs that refine twice on the tiled set, on the CPU (CUDA hidden from the child:
``CUDA_VISIBLE_DEVICES=""``, so every stage takes the CPU path) and on the default device
(CUDA when present), and counts the labels that differ, with the CPU's top-2 margin at each
(issue 36: a difference at a near-tie is float rounding; one at a wide margin is a bug). Cells
``compare-M*-K*.json``; on a machine without CUDA both runs are the CPU path.

    python bench/scale.py --compare --M 20000 --K 10 --threads 8

``--poison x100|flipped`` runs the same with the first party's bundle replaced (weights × 100,
or its last layer rolled by one class: it predicts y + 1), and records the labels' accuracy
(against mnist5k's y, tiled like the images) and the parties the reliability checks flagged
(cells ``e2e-M*-K*-POISON.json``; the clean cells record both too).

``SCALE_OPTIONS="adapt_vote=true"`` (space-separated ``KEY=VALUE``) passes the method's
options to ``mrtf refine --option`` (cells ``e2e-M*-K*-KEY-VALUE.json``, not in the plot).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from rss_timeline import run_sampled

STAGES = ("teachers", "targets", "clr", "kmeans", "distill")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def tiled_h5(path: Path, m: int) -> Path:
    """mnist5k tiled to ``m`` rows as uint8 (images ×255, rounded), written once, in blocks."""
    import h5py

    from mrtf.data import load_builtin

    if path.exists():
        return path
    x = np.rint(load_builtin("mnist5k").x * 255).astype(np.uint8)
    tmp = path.with_suffix(".tmp")
    with h5py.File(tmp, "w") as f:
        out = f.create_dataset("x", (m, *x.shape[1:]), np.uint8, chunks=(1024, *x.shape[1:]))
        for s in range(0, m, len(x)):
            out[s:s + len(x)] = x[: min(len(x), m - s)]
    tmp.rename(path)
    return path


def run_cell(h5: Path, k: int, steps: int, threads: int) -> dict:
    """One cell: every stage timed in turn, with the peak RSS reached after it."""
    import torch

    from mrtf.io.hdf5 import H5Dataset
    from mrtf.models import build_model
    from mrtf.refinery import RefineConfig, distill, ensemble_targets, prototype_targets
    from mrtf.refinery.cluster import kmeans_view
    from mrtf.refinery.teachers import teacher_logits

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    models = [build_model("lenet", 10).eval() for _ in range(k)]
    src = H5Dataset(h5)
    row: dict = {"M": len(src), "K": k, "threads": threads, "distill_steps": steps,
                 "commit": _commit(), "rss_start_mb": _peak_mb(), "stages": {}}

    def stage(name: str, fn):
        t0 = time.perf_counter()
        out = fn()
        row["stages"][name] = {"s": time.perf_counter() - t0, "peak_rss_mb": _peak_mb(),
                               "load": os.getloadavg()[0]}
        return out

    out = stage("teachers", lambda: teacher_logits(models, src, 1024, "cpu",
                                                   features_of=models[0]))
    targets = stage("targets", lambda: ensemble_targets(out.logits, k - 2,
                                                        RefineConfig(method="st+rd"), 0.6))
    stage("clr", lambda: prototype_targets(targets, out.features))
    stage("kmeans", lambda: kmeans_view(out.features, 20, seed=0))
    out.logits = None
    stage("distill", lambda: distill(models[0], src, targets, steps=steps, batch_size=64))
    row["feature_dim"] = int(out.features.shape[1])
    row["teacher_model_samples_per_s"] = k * row["M"] / row["stages"]["teachers"]["s"]
    row["total_s"] = sum(v["s"] for v in row["stages"].values())
    return row


def _commit() -> str:
    """The code a cached cell was measured with (cells of a resumed grid may differ)."""
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"],
                                       cwd=Path(__file__).parent, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cell_path(root: Path, m: int, k: int) -> Path:
    return root / f"cell-M{m}-K{k}.json"


def collect(root: Path) -> list[dict]:
    rows = [json.loads(p.read_text()) for p in root.glob("cell-M*-K*.json")]
    return sorted(rows, key=lambda r: (r["K"], r["M"]))


def plot(rows: list[dict], out: Path) -> None:
    """Time per stage (left) and peak RSS (right) against M, log-log, one line style per K."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for k, style in zip(sorted({r["K"] for r in rows}), ("-o", "--s", ":^")):
        cells = [r for r in rows if r["K"] == k]
        ms = [r["M"] for r in cells]
        for i, name in enumerate(STAGES):  # colour = stage, line style = K
            ax_t.plot(ms, [r["stages"][name]["s"] for r in cells], style, color=f"C{i}",
                      label=f"{name} K={k}")
        ax_m.plot(ms, [max(v["peak_rss_mb"] for v in r["stages"].values()) for r in cells],
                  style, color="k", label=f"K={k}")
    for ax, ylabel in ((ax_t, "wall time per stage (s)"), (ax_m, "peak RSS (MB)")):
        ax.set(xscale="log", yscale="log", xlabel="target-set size M", ylabel=ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("mrtf refinery at scale (bench/scale.py; loaded 2-core machine, see load)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--M", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--K", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--steps", type=int, default=100, help="distillation steps (batch 64)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dir", default="runs/scale")
    ap.add_argument("--cell", nargs=2, metavar=("H5", "K"), help=argparse.SUPPRESS)
    ap.add_argument("--e2e", action="store_true", help="time `mrtf refine --stream on`")
    ap.add_argument("--method", default="adaptive", help="--e2e: the refine method")
    ap.add_argument("--poison", choices=("x100", "flipped"),
                    help="--e2e: the first party's bundle poisoned this way")
    ap.add_argument("--e2e-cell", nargs=2, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--compare", action="store_true",
                    help="refine on the CPU path and on the default device, compare labels")
    args = ap.parse_args()
    if args.compare:
        return main_compare(args)
    if args.e2e_cell:
        m, k = args.e2e_cell
        print(json.dumps(run_e2e(Path(args.dir), m, k, args.threads, args.method,
                                 args.poison)))
        return
    if args.e2e:
        return main_e2e(args)
    if args.cell:
        row = run_cell(Path(args.cell[0]), int(args.cell[1]), args.steps, args.threads)
        print(json.dumps(row))
        return
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    for m in args.M:
        for k in args.K:
            done = cell_path(root, m, k)
            if done.exists():
                print(f"M={m} K={k}: cached ({done})", flush=True)
                continue
            h5 = tiled_h5(root / f"mnist5k-tiled-{m}.h5", m)
            cmd = [sys.executable, __file__, "--cell", str(h5), str(k), "--steps",
                   str(args.steps), "--threads", str(args.threads)]
            row = json.loads(subprocess.check_output(cmd).decode().splitlines()[-1])
            done.write_text(json.dumps(row, indent=2))
            print(_fmt(row), flush=True)
    rows = collect(root)
    from harness import write_json  # here: the --cell workers' peak RSS stays clean

    write_json(root / "scale.json", {"rows": rows})
    plot(rows, root / "scale.png")
    print(f"saved {root / 'scale.json'} and {root / 'scale.png'} ({len(rows)} cells)")


#: "calibration" is timed by refine since 2026-11-23 (earlier cells count it under "write")
E2E_STAGES = ("teachers", "clr", "calibration", "distill", "predict", "write")


def received_parties(root: Path, k: int) -> Path:
    """K LeNet parties (and θ_t) of one FedAvg round on mnist5k, exported once."""
    out = root / f"received-K{k}"
    if not out.exists():
        subprocess.run(["mrtf", "simulate", "--dataset", "mnist5k", "--clients", str(k),
                        "--split", "dirichlet:0.5", "--ratio", "1.0", "--rounds", "1",
                        "--epochs", "1", "--arch", "lenet", "--seed", "0", "--quiet",
                        "--export-received", str(out)], check=True)
    return out


def poisoned_parties(root: Path, k: int, kind: str) -> Path:
    """received_parties with the first local party's bundle poisoned (``kind`` x100 or
    flipped), written once beside it."""
    from mrtf.io.bundles import load_bundle, model_files, save_bundle

    clean = received_parties(root, k)
    out = root / f"received-K{k}-{kind}"
    if out.exists():
        return out
    tmp = root / f".received-K{k}-{kind}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(clean, tmp, symlinks=False)
    first = next(p for p in model_files(tmp) if load_bundle(p).meta.role == "local")
    m = load_bundle(first)
    state = dict(m.state_dict)
    if kind == "x100":
        state = {n: v * 100 if v.is_floating_point() else v for n, v in state.items()}
    else:  # flipped: the last layer's rows rolled by one class (as bench/poison.py's "rolled")
        from poison import rolled_state

        state = rolled_state(state)
    save_bundle(first, state, m.meta)
    tmp.rename(out)
    return out


def tiled_labels(m: int) -> np.ndarray:
    """mnist5k's y tiled like tiled_h5's images (scores the labels; refine never sees it)."""
    from mrtf.data import load_builtin

    y = load_builtin("mnist5k").y
    return np.resize(y, m)


def run_e2e(root: Path, m: int, k: int, threads: int, method: str,
            poison: str | None = None) -> dict:
    """``mrtf refine`` of the tiled set, streamed, in a child process: its stages, wall,
    peak RSS, the labels' accuracy and the parties it flagged."""
    from mrtf.io.labels import read_labels

    h5 = tiled_h5(root / f"mnist5k-tiled-{m}.h5", m)
    out = root / f"out-M{m}-K{k}"
    parties = received_parties(root, k) if poison is None else poisoned_parties(root, k, poison)
    load0 = os.getloadavg()[0]
    summary, wall = refine_once(parties, h5, out, method, {"OMP_NUM_THREADS": str(threads)})
    stages = {n: {"s": v} for n, v in summary["timings"].items()}
    stages["write"] = {"s": wall - sum(v["s"] for v in stages.values())}  # + start-up
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss = usage.ru_maxrss / 1024
    accuracy = float((read_labels(out / "labels.h5").labels == tiled_labels(m)).mean())
    flagged = {p["name"]: p["verdict"] for p in summary.get("reliability") or []
               if p["verdict"] != "trusted"}
    _remove(out)  # the labels and model are not kept (1M: 60 MB)
    return {"M": m, "K": k, "threads": threads, "method": method, "commit": _commit(),
            "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,  # the load-free figure
            "peak_rss_mb": rss, "load_before": load0,
            "load_after": os.getloadavg()[0], "stages": stages,
            "outputs_mb": whole_length_mb(m, 10), "poison": poison, "accuracy": accuracy,
            "flagged": flagged, "estimated_accuracy": summary.get("estimated_accuracy"),
            "options": os.environ.get("SCALE_OPTIONS", ""),
            "memory": summary["memory"]}


def refine_once(parties: Path, h5: Path, out: Path, method: str, env: dict[str, str]
                ) -> tuple[dict, float]:
    """``mrtf refine --stream on`` of ``h5`` into ``out`` with ``env`` added to the child's
    environment: (its --json summary, wall seconds)."""
    # MRTF_PROFILE=FILE: the child runs under cProfile, its stats written to FILE (on CUDA the
    # time of asynchronous kernels lands on the call that waits for them)
    prof = os.environ.get("MRTF_PROFILE")
    run = [sys.executable, "-m", "cProfile", "-o", prof, shutil.which("mrtf") or "mrtf"] \
        if prof else ["mrtf"]
    stages = out.parent / f".stages-{out.name}.json"
    child = {**os.environ, **env}  # SCALE_STAGES / SCALE_TRIM from either
    trim = child.get("SCALE_TRIM") == "1"
    if child.get("SCALE_STAGES") == "1" or trim:
        # stage_memory.py: the memory at each stage's end (and malloc_trim there, SCALE_TRIM)
        run = [sys.executable, str(Path(__file__).with_name("stage_memory.py")), str(stages),
               *(["--trim"] if trim else []), "--"]
    cmd = [*run, "refine", str(parties), "--data", str(h5), "--labels",
           str(out / "labels.h5"), "--model", str(out / "refined.safetensors"), "--method",
           method, "--stream", "on", "--force", "--json", "--quiet"]
    # SCALE_OPTIONS="KEY=VALUE ...": the method's options (mrtf refine --option)
    cmd += [arg for opt in child.get("SCALE_OPTIONS", "").split() for arg in ("--option", opt)]
    proc = run_sampled(cmd, child)
    if proc.returncode:  # its own error, not only "exit status 1"
        sys.stderr.write(proc.stderr[-4000:])
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    # what the peak was made of, and when (rss_timeline.py): the GPU path's peak RSS
    summary["memory"] = {"peak": proc.peak, "timeline": proc.timeline,
                         "stages": json.loads(stages.read_text()) if stages.exists() else None,
                         "trim": trim}
    stages.unlink(missing_ok=True)
    return summary, proc.wall_s


def _remove(out: Path) -> None:
    for p in out.iterdir():
        p.unlink()
    out.rmdir()


def compare_devices(root: Path, m: int, k: int, threads: int, method: str) -> dict:
    """The same refine on the CPU path (CUDA hidden) and on the default device: the labels
    that differ, the CPU's top-2 probability margin at each, and each run's stages."""
    from mrtf.io.labels import read_labels

    h5 = tiled_h5(root / f"mnist5k-tiled-{m}.h5", m)
    parties = received_parties(root, k)
    runs, labels = {}, {}
    for name, hide in (("cpu", {"CUDA_VISIBLE_DEVICES": ""}), ("device", {})):
        out = root / f"compare-{name}-M{m}-K{k}"
        summary, wall = refine_once(parties, h5, out, method,
                                    {"OMP_NUM_THREADS": str(threads), **hide})
        labels[name] = read_labels(out / "labels.h5")
        runs[name] = {"wall_s": wall, "stages": summary["timings"],
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                      / 1024}  # the largest child so far
        _remove(out)
    cpu, dev = labels["cpu"], labels["device"]
    differ = np.flatnonzero(cpu.labels != dev.labels)
    top2 = np.sort(cpu.probs, 1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    return {"M": m, "K": k, "threads": threads, "method": method, "commit": _commit(),
            "cuda": _cuda_name(), "runs": runs, "differences": int(len(differ)),
            "rows_differing": differ[:50].tolist(),
            "cpu_margin_at_differences": margin[differ[:50]].round(6).tolist(),
            "cpu_margin_median": float(np.median(margin)),
            "max_abs_prob_diff": float(np.abs(cpu.probs - dev.probs).max()),
            "accuracy": {n: float((v.labels == tiled_labels(m)).mean())
                         for n, v in labels.items()}}


def _cuda_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def whole_length_mb(m: int, c: int, k_neighbours: int = 10) -> float:
    """MB of the arrays the refinery holds whole by design (O(M) each, never O(M·K) or
    O(M·D)): its three (M, C) float32 results (probs, targets, θ_{t+1}'s probs), two (M, C)
    float64 (the adaptive consensus' posterior and EM start), the calibration's two (M, C)
    float32 signals (the parties' vote shares and mean probability), its (M, k) int32
    target neighbours and its (M,) float32 confidence (and labels, int64)."""
    return m * (c * (3 * 4 + 2 * 8 + 2 * 4) + k_neighbours * 4 + 4 + 8) / 2**20


def plot_e2e(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    ms = [r["M"] for r in rows]
    for i, name in enumerate(E2E_STAGES):
        label = "targets (clr / consensus)" if name == "clr" else name
        ax_t.plot(ms, [max(r["stages"].get(name, {"s": 0.0})["s"], 1e-2) for r in rows], "-o",
                  color=f"C{i}", label=label)
    ax_t.plot(ms, [r["wall_s"] for r in rows], "-k", label="wall")
    ax_m.plot(ms, [r["peak_rss_mb"] for r in rows], "-ok", label="peak RSS")
    ax_m.plot(ms, [r["outputs_mb"] for r in rows], "--", color="grey",
              label="(M, C) outputs held")
    for ax, ylabel in ((ax_t, "seconds"), (ax_m, "MB")):
        ax.set(xscale="log", yscale="log", xlabel="target-set size M", ylabel=ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    ks = sorted({r["K"] for r in rows})
    fig.suptitle(f"mrtf refine --stream on, K={ks} LeNets (bench/scale.py --e2e; "
                 f"{rows[0]['threads']} threads, loaded 2-core machine)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main_e2e(args: argparse.Namespace) -> None:
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    for m in args.M:
        for k in args.K:
            tag = "" if args.poison is None else f"-{args.poison}"
            tag += "-trim" if os.environ.get("SCALE_TRIM") == "1" else ""
            tag += "".join(f"-{o.replace('=', '-')}"
                           for o in os.environ.get("SCALE_OPTIONS", "").split())
            done = root / f"e2e-M{m}-K{k}{tag}.json"
            if not done.exists():
                # one child per cell: RUSAGE_CHILDREN is this process' children's maximum
                cmd = [sys.executable, __file__, "--e2e-cell", str(m), str(k), "--dir",
                       str(root), "--threads", str(args.threads), "--method", args.method]
                cmd += [] if args.poison is None else ["--poison", args.poison]
                row = subprocess.check_output(cmd).decode().splitlines()[-1]
                done.write_text(json.dumps(json.loads(row), indent=2))
            r = json.loads(done.read_text())
            print(f"M={m} K={k}{tag}: wall {r['wall_s']:.0f}s, peak RSS "
                  f"{r['peak_rss_mb']:.0f} MB, accuracy {r.get('accuracy', float('nan')):.4f}, "
                  f"flagged {r.get('flagged')}, "
                  + " ".join(f"{n} {v['s']:.1f}s" for n, v in r["stages"].items()), flush=True)
            if r.get("memory"):  # what the peak was made of (MB), and when (s)
                print("  at the peak: " + " ".join(f"{n} {v:.0f}" for n, v in
                                                   r["memory"]["peak"].items()), flush=True)
                for row in r["memory"].get("stages") or ():  # SCALE_STAGES / SCALE_TRIM
                    print(f"  after {row['stage']:16s} {row['s']:6.1f}s RSS {row['VmRSS']:.0f}"
                          f" (anon {row['RssAnon']:.0f}) peak so far {row['VmHWM']:.0f}",
                          flush=True)
    if args.poison is not None or os.environ.get("SCALE_TRIM") == "1" \
            or os.environ.get("SCALE_OPTIONS"):
        return  # the time and memory plot is of the clean, untrimmed cells of the default
    rows = sorted((json.loads(p.read_text()) for p in root.glob("e2e-M*-K*.json")
                   if not json.loads(p.read_text()).get("poison")
                   and not json.loads(p.read_text()).get("options")
                   and not p.name.endswith("-trim.json")),
                  key=lambda r: (r["K"], r["M"]))
    (root / "scale-e2e.json").write_text(json.dumps(rows, indent=2))
    plot_e2e(rows, root / "scale-e2e.png")
    print(f"saved {root / 'scale-e2e.json'} and {root / 'scale-e2e.png'}")


def main_compare(args: argparse.Namespace) -> None:
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    for m in args.M:
        for k in args.K:
            row = compare_devices(root, m, k, args.threads, args.method)
            (root / f"compare-M{m}-K{k}.json").write_text(json.dumps(row, indent=2))
            print(f"M={m} K={k}: {row['differences']} labels differ between the CPU path and "
                  f"{row['cuda'] or 'the CPU (no CUDA here)'}; CPU top-2 margin at them "
                  f"{row['cpu_margin_at_differences'][:10]} (median over all rows "
                  f"{row['cpu_margin_median']:.3f}); max |Δprob| {row['max_abs_prob_diff']:.2e}",
                  flush=True)
            for name, r in row["runs"].items():
                print(f"  {name}: wall {r['wall_s']:.1f}s, peak RSS {r['peak_rss_mb']:.0f} MB, "
                      + " ".join(f"{n} {v:.1f}s" for n, v in r["stages"].items()), flush=True)


def _fmt(r: dict) -> str:
    parts = " ".join(f"{n} {v['s']:.1f}s" for n, v in r["stages"].items())
    peak = max(v["peak_rss_mb"] for v in r["stages"].values())
    return f"M={r['M']:>8} K={r['K']:>3}: {parts} | peak RSS {peak:.0f} MB"


if __name__ == "__main__":
    main()
