"""``mrtf inspect PATH``: what was received, or what a file holds."""

from __future__ import annotations

from pathlib import Path

import click

from mrtf.cli.common import Out, output_options, shown, table
from mrtf.errors import InputError
from mrtf.io.bundles import MODEL_SUFFIXES, ReceivedSet, load_bundle, load_received
from mrtf.io.fits import check_model_fits
from mrtf.io.hdf5 import H5Dataset, RowSubset, describe_h5
from mrtf.io.limits import check_memory, labeling_bytes
from mrtf.jobs.guard import run_guarded
from mrtf.refinery.assess import assess_received
from mrtf.refinery.config import RefineConfig
from mrtf.refinery.pipeline import preview
from mrtf.trust.parties import plan_parties
from mrtf.trust.received import sample_rows


@click.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--trust-arch", multiple=True,
              help="A package.module:factory architecture you trust (local code).")
@click.option("--data", type=click.Path(path_type=Path), default=None,
              help="With a received directory: measure every party on this target set "
                   "(.h5 with x; y, if any, is checked but not used) and give each a verdict.")
@click.option("--device", default=None, help="cpu, cuda, ... (default: CUDA when present).")
@output_options
def inspect(path: Path, trust_arch: tuple[str, ...], out: Out, data: Path | None = None,
            device: str | None = None) -> None:
    """Show a received-models directory, one model file, or an HDF5 file. With --data, a
    received directory also gets a per-party reliability table (trusted / down-weighted /
    excluded, and why) and the plan ``mrtf refine --data`` would follow with its defaults
    (teachers, the parameter average or not, vote or adapt), without refining."""
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if data is not None and not path.is_dir():
        raise InputError("--data applies to a received directory only")
    if path.is_dir():
        _inspect_dir(path, trust_arch, out, data, device)
    elif path.suffix in MODEL_SUFFIXES:
        model = load_bundle(path, trust_arch)
        for note in model.notes:
            out.warn(f"{path.name}: {note}")
        info = _model_row(model)
        info["tensors"] = len(model.state_dict)
        info["parameters"] = int(sum(t.numel() for t in model.state_dict.values()))
        if model.onnx is not None:  # a graph: its nodes and stored values instead
            info["tensors"] = f"{len(model.onnx.model.graph.node)} ONNX nodes"
            info["parameters"] = model.onnx.values
        for key, value in info.items():
            out.say(f"{key:>12}: {shown(value)}")
        out.summary({"command": "inspect", "kind": "model", **info})
    elif path.suffix in (".h5", ".hdf5"):
        info = describe_h5(path)
        out.say(str(path))
        out.say(table([[k, "×".join(map(str, v["shape"])), v["dtype"]]
                       for k, v in info["datasets"].items()]
                      + [[k, "-", f"({v}; not followed)"] for k, v in info["links"].items()],
                      ["dataset", "shape", "dtype"]))
        for key, value in info["attrs"].items():
            out.say(f"  @{shown(key, 80)} = {shown(value, 100)}")
        out.summary({"command": "inspect", "kind": "hdf5", **info})
    else:
        raise InputError(f"{path}: don't know how to inspect this (expected a directory, "
                         ".safetensors, .pt, .onnx or .h5)")


def _model_row(m) -> dict:
    meta = m.meta
    return {"file": m.path.name, "party": meta.party, "role": meta.role, "arch": meta.arch,
            "arch_kwargs": meta.arch_kwargs, "classes": meta.num_classes,
            "samples": meta.n_samples, "loss": meta.train_loss, "round": meta.round_number,
            "label_counts": meta.label_counts}


def _inspect_dir(path: Path, trust: tuple[str, ...], out: Out, data: Path | None = None,
                 device: str | None = None) -> None:
    received = load_received(path, trust, strict=False)
    for note in received.notes:
        out.warn(note)
    rows = [{**_model_row(m), "status": "valid"} for m in received.models]
    rows += [{"file": f.name, "status": f"refused: {why}"} for f, why in received.refused]
    rows.sort(key=lambda r: r["file"])
    if not rows:
        raise InputError(f"{path}: holds no received models (.safetensors, .pt or .onnx)")
    out.say(table([[r["file"], r.get("party"), r.get("role"), r.get("arch"), r.get("classes"),
                    r.get("samples"), r.get("loss"), r.get("round"),
                    _counts(r.get("label_counts")), r["status"]] for r in rows],
                  ["file", "party", "role", "arch", "classes", "samples", "loss", "round",
                   "label counts", "status"]))
    out.say(f"{len(received.models)} valid, {len(received.refused)} refused")
    # claims refine would refuse (a lone newer round, a false θ_t) and copies under other names
    for r in plan_parties(received, "refine") if received.models else []:
        if r.suspicious:
            out.warn(f"not used: {r.file} ({r.party}): {r.why}")
    reliability = plan = None
    if data is not None:
        reliability, plan = _reliability(received, data, device, out)
    out.summary({"command": "inspect", "kind": "received", "models": rows,
                 "valid": len(received.models), "refused": len(received.refused),
                 "reliability": reliability, "plan": plan})


def _reliability(received: ReceivedSet, data: Path, device: str | None, out: Out
                 ) -> tuple[list[dict], list[str]]:
    """Every local model of the newest round measured on ``data``: the table and verdicts;
    then refine's plan (:func:`_plan`). Returns the parties' reliability and the plan's
    lines."""
    if not received.models:
        raise InputError("no valid received model to measure on --data")
    with H5Dataset(data) as source:
        # the limits of refine and label, before any model runs: a set they would refuse is
        # refused here too (its rows are only sampled, but reading a sample of 10^9 declared
        # rows is no preview of a run that cannot happen)
        check_memory(labeling_bytes(len(source), received.num_classes),
                     f"{data.name}: labeling its {len(source):,} samples")
        source.check_columns(received.num_classes, " of the received models")
        for m in received.models:
            check_model_fits(m.build(), m.path.name, source, m.meta.num_classes,
                             m.meta.arch_kwargs)
        report = run_guarded(lambda: assess_received(received, source, device,
                                                     progress=out.progress))
        plan = _plan(received, source, device, out)
    # first what the checks measured, then what refine would do with it
    out.say(f"\nreliability on {data.name} ({len(report.parties)} local models; y not used)")
    out.say(table(report.rows(), report.HEADER))
    for note in report.notes:
        out.say(f"note: {note}")
    flagged = report.flagged
    out.say(f"{len(flagged)} flagged: " + (", ".join(f"{p.name} ({p.verdict})" for p in flagged)
                                          if flagged else "none"))
    out.say(f"\nplan of mrtf refine --data {data.name} (its defaults; nothing is refined)")
    for line in plan:
        out.say(line)
    return [p.to_dict() for p in report.parties], plan


def _plan(received: ReceivedSet, source: H5Dataset, device: str | None, out: Out
          ) -> list[str]:
    """The plan ``mrtf refine`` with its defaults would follow (mrtf.refinery.preview): its
    party checks and data pass, on the rows the checks read (all of a target up to
    mrtf.trust.received.TRUST_SAMPLE samples, else the same seeded subset), no distillation.
    A refusal (parties of different architectures need a student) is the plan's line;
    the lines are returned, not said."""
    config = RefineConfig(device=device, progress=out.progress)
    rows = sample_rows(len(source), config.seed)
    seen = source if rows is None else RowSubset(source, rows)
    try:
        plan, choice = run_guarded(lambda: preview(received, seen, config))
    except InputError as exc:
        lines = [f"plan: refine would stop here: {exc}"]
    else:
        lines = [*plan.lines(), f"plan: {choice}"]
    return lines


def _counts(counts: list[int] | None) -> str:
    return "-" if counts is None else " ".join(str(c) for c in counts)
