"""Every command in the README runs somewhere: each ``mrtf ...`` command (in a code block or
in the text) is parsed by the real click command here, options, values and types included;
the set-up, test and docs commands are the ones ``.ci/run`` runs. A command that fits neither
fails the test, so a new command in the README must be checked before it lands."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from mrtf.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

#: commands ``.ci/run`` (or another test) runs, exactly as the README writes them
RUN_ELSEWHERE = {
    "python3 -m venv .venv": ".ci/run",
    ". .venv/bin/activate": ".ci/run",
    "pip install torch==2.13.0": ".ci/run",
    "pip install -e '.[datasets]'": "setup; the datasets extra is part of '.[test]' (.ci/run)",
    "pip install -e '.[test]'": ".ci/run",
    "pip install -e '.[dev]'": "the same packages as '.[test]' (.ci/run)",
    "pip install -e '.[docs]'": ".ci/run",
    "python -m pytest": ".ci/run",
    "ruff check .": ".ci/run",
    "mkdocs build --strict": ".ci/run",
    "python scripts/check_structure.py --check": "tests/structure/test_structure.py",
}


def shell_commands(text: str) -> list[str]:
    """The commands of the README's ``bash`` blocks: continuations joined, comments dropped,
    ``&&`` chains split."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            commands += [c.strip() for c in line.split("&&") if c.strip()]
    return commands


def inline_commands(text: str) -> list[str]:
    """``mrtf ...`` commands quoted in the text (tables, sentences), but not placeholders."""
    spans = re.findall(r"`(mrtf [^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    # `mrtf convert` alone names a command in a sentence: it is checked with its arguments
    return [s for s in spans if "..." not in s and "*" not in s and len(s.split()) > 2]


def parse(command: str) -> None:
    """Parse an ``mrtf`` command line with the real CLI without running it: unknown options,
    missing values, wrong types or choices raise click's UsageError."""
    args = shlex.split(command)
    assert args[0] == "mrtf" and len(args) >= 2, command
    ctx = click.Context(cli, info_name="mrtf")
    sub = cli.get_command(ctx, args[1])
    if sub is None:
        raise click.UsageError(f"no command {args[1]!r}")
    with sub.make_context(args[1], args[2:], parent=ctx):
        pass


README_TEXT = README.read_text(encoding="utf-8")
MRTF = [c for c in shell_commands(README_TEXT) if c.startswith("mrtf ")] + \
    inline_commands(README_TEXT)


def test_readme_is_a_short_user_guide():
    assert len(README_TEXT.splitlines()) <= 250
    assert len(MRTF) >= 10  # the extraction found the README's commands


@pytest.mark.parametrize("command", MRTF)
def test_readme_mrtf_command_parses(command):
    parse(command)


def test_every_other_readme_command_runs_in_ci_or_a_test():
    others = [c for c in shell_commands(README_TEXT) if not c.startswith("mrtf ")]
    assert others, "no set-up commands found"
    unchecked = [c for c in others if c not in RUN_ELSEWHERE]
    assert not unchecked, f"README commands nothing runs: {unchecked}"
    ci = (ROOT / ".ci" / "run").read_text()
    for command, where in RUN_ELSEWHERE.items():
        if where == ".ci/run":
            assert command.replace("pip install", "python -m pip install -q") in ci or \
                command in ci, f".ci/run does not run {command!r}"


def test_parse_rejects_what_the_cli_rejects():
    """The check can fail: an unknown option and a bad value are refused."""
    with pytest.raises(click.UsageError):
        parse("mrtf refine runs/received --no-such-option")
    with pytest.raises(click.BadParameter):
        parse("mrtf simulate --rounds ten")


GUIDE_MRTF = sorted({(page.name, c) for page in (ROOT / "docs" / "guide").glob("*.md")
                     for text in [page.read_text(encoding="utf-8")]
                     for c in shell_commands(text)
                     if c.startswith("mrtf ") and "..." not in c})


@pytest.mark.parametrize(("page", "command"), GUIDE_MRTF)
def test_user_guide_mrtf_command_parses(page, command):
    """The ``mrtf`` commands of the user guide's code blocks parse too (the docs site shows
    them; its prose quotes fragments such as ``mrtf score --plot FILE.png``, not checked)."""
    parse(command)


#: written on another branch of the same change (the user guide's own-models page)
PENDING: set[str] = set()


def test_readme_links_point_at_files_that_exist():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README_TEXT)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert len(local) >= 10
    missing = [link for link in local if not (ROOT / link).exists() and link not in PENDING]
    assert not missing, f"README links to missing files: {missing}"
