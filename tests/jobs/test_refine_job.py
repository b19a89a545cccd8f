"""The refine job as a library call (mrtf.jobs): its parameters checked once, what it says and
when (the plan before the long steps), ``inspect --data`` showing the same plan, and the
Flower pilot party's job being the command it records."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import mrtf.refinery.pipeline as pipeline
from mrtf import InputError, RefineConfig, RefinedFiles, RefineJob, Reporter, refine_files
from mrtf.cli.main import cli
from mrtf.io.labels import read_labels

PLAN = ("plan: ", "trust: ")


def plan_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(PLAN)]


class Recorder(Reporter):
    """Every hook call, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def say(self, line: str) -> None:
        self.events.append(("say", line))

    def planned(self, preview) -> None:
        self.events.append(("planned", preview))

    def chosen(self, line: str) -> None:
        self.events.append(("chosen", line))

    def refined(self, files) -> None:
        self.events.append(("refined", files))


def test_job_parameters_are_checked_when_made(digits_federation, tmp_path):
    received, target, _ = digits_federation
    with pytest.raises(InputError, match="--labels needs --data"):
        RefineJob(received, labels=tmp_path / "l.h5")
    with pytest.raises(InputError, match="nothing to write"):
        RefineJob(received, data=target)
    with pytest.raises(InputError, match="--aggregate: aggregate must be"):
        RefineJob(received, data=target, labels=tmp_path / "l.h5",
                  config=RefineConfig(aggregate="mode"))
    with pytest.raises(InputError, match="--neighbour-vote must be >= 0"):
        RefineJob(received, data=target, labels=tmp_path / "l.h5",
                  config=RefineConfig(neighbour_vote=-1))
    with pytest.raises(InputError, match="not both"):
        RefineJob(received, data=target, labels=tmp_path / "l.h5", min_confidence=0.5,
                  coverage=0.5)
    with pytest.raises(InputError, match="apply with --data only"):
        RefineJob(received, model=tmp_path / "m.safetensors", config=RefineConfig(trust=True))
    job = RefineJob(str(received), data=str(target), labels=str(tmp_path / "l.h5"))
    assert job.received == received and isinstance(job.labels, Path)
    assert list(tmp_path.iterdir()) == []  # nothing is touched by making a job


def test_library_job_says_the_plan_before_the_work_and_writes_the_labels(digits_federation,
                                                                         tmp_path):
    received, target, _ = digits_federation
    config = RefineConfig(steps=5, progress=False)
    recorder = Recorder()
    done = refine_files(RefineJob(received, data=target, labels=tmp_path / "l.h5",
                                  config=config), recorder)
    kinds = [kind for kind, _ in recorder.events]
    assert kinds.index("planned") < kinds.index("chosen") < kinds.index("refined")
    assert kinds.count("planned") == kinds.count("chosen") == kinds.count("refined") == 1
    said = [e for kind, e in recorder.events if kind == "say"]
    assert said[-1] == f"wrote labels for {done.samples} samples to {tmp_path / 'l.h5'}"
    preview = dict(recorder.events)["planned"]
    assert preview.method == "adaptive" and preview.average
    assert preview.verdicts == done.result.parties.verdicts
    assert isinstance(done, RefinedFiles)
    written = read_labels(tmp_path / "l.h5")
    assert np.array_equal(written.labels, done.labels.labels)
    assert np.array_equal(written.labels, done.result.probs.argmax(1))
    # the job settles stream and scratch_dir on its own copy, never on the caller's config
    assert config.stream == "auto" and config.scratch_dir is None
    assert done.result.config.scratch_dir == str(tmp_path)


def test_cli_prints_the_plan_before_the_distillation(digits_federation, tmp_path,
                                                     monkeypatch):
    """A run stopped where the distillation starts has already printed the parties table,
    the trust verdicts, the average-or-not plan and the vote-or-adapt choice, and wrote
    nothing; ``inspect --data`` prints the same plan lines without refining."""
    received, target, _ = digits_federation

    def stop(state):
        raise InputError("stopped where the distillation starts")

    monkeypatch.setattr(pipeline, "fit", stop)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["refine", str(received), "--data", str(target),
                                   "--labels", str(out / "l.h5"), "--steps", "5"])
    assert res.exit_code == 2, res.output
    assert "stopped where the distillation starts" in res.stderr
    assert not out.exists()
    assert res.stdout.splitlines()[0].startswith("parties used: ")
    lines = plan_lines(res.stdout)
    assert lines[0].startswith("plan: method adaptive; ")
    assert any(ln.startswith("plan: starts from θ_{t+1}, the parameter average") for ln in lines)
    assert any(ln.startswith("plan: parties share a basin") for ln in lines)
    assert sum(ln.startswith("trust: ") and ln.endswith(": trusted") for ln in lines) == 4
    assert lines[-1].startswith("plan: target novelty: ")
    monkeypatch.undo()
    shown = CliRunner().invoke(cli, ["inspect", str(received), "--data", str(target)])
    assert shown.exit_code == 0, shown.output
    assert "nothing is refined" in shown.stdout
    assert plan_lines(shown.stdout) == lines


def test_cli_plan_comes_before_the_account(digits_federation, tmp_path):
    received, target, _ = digits_federation
    res = CliRunner().invoke(cli, ["refine", str(received), "--data", str(target),
                                   "--labels", str(tmp_path / "l.h5"), "--steps", "5"])
    assert res.exit_code == 0, res.output
    text = res.stdout
    assert text.index("plan: target novelty") < text.index("source client-") < \
        text.index("accuracy on --data y") < text.index("wrote labels")
    # the reliability table, the verdicts, the basin and the vote-or-adapt choice are said
    # once, before the work; the account after the run does not repeat them
    lines = text.splitlines()
    header = [i for i, ln in enumerate(lines) if ln.startswith("party ") and "verdict" in ln]
    assert len(header) == 1 and header[0] < lines.index(plan_lines(text)[0])
    assert text.count("parties flagged") == 1 and text.count("parties share a basin") == 1
    assert text.count("target novelty: ") == 1 and text.count("vote or adapt: ") == 1


def test_pilot_party_job_is_the_command_it_records(tmp_path, monkeypatch):
    """The Flower pilot party runs refine_files in its process; the command line it writes to
    summary.json builds the same job through ``mrtf refine``."""
    pytest.importorskip("flwr")
    import mrtf.cli.refine as refine_cli
    from mrtf.engines.flower.config import FlowerConfig
    from mrtf.engines.flower.pilot import refine_args, refine_job

    cfg = FlowerConfig(mode="pilot", target=str(tmp_path / "t.h5"), out=str(tmp_path),
                       refine_steps=7, clr_min_round=2, seed=3, pilot_method="mrtf")
    seen = []
    monkeypatch.setattr(refine_cli, "refine_files",
                        lambda job, reporter: seen.append(job) or (_ for _ in ()).throw(
                            InputError("captured")))
    res = CliRunner().invoke(cli, refine_args(cfg, tmp_path / "received", tmp_path))
    assert res.exit_code == 2 and "captured" in res.stderr
    want = refine_job(cfg, tmp_path / "received", tmp_path)
    assert dataclasses.asdict(seen[0]) == dataclasses.asdict(want)
