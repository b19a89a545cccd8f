"""bench/ still runs after refactors: every name a benchmark or archived study imports from
mrtf or from another bench module exists, and the maintained benchmarks import no private
name of mrtf except the teacher paths the speed benchmarks time. (Running each script's
``--help`` costs a torch import per script; this reads them with ``ast`` instead.)"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
SCRIPTS = sorted([*BENCH.glob("*.py"), *(BENCH / "studies").glob("*.py")])
#: modules a script may import from bench/ (the harness, benchmarks, studies)
LOCAL = {p.stem: p for p in SCRIPTS}
#: private names the speed benchmarks time on purpose
TIMED_PRIVATE = {"_looped_forward", "_stacked_forward"}


def imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every import anywhere in the file; name None for ``import m``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.module, a.name) for a in node.names]
    return found


def top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
    return names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(BENCH)))
def test_bench_script_imports_resolve(script):
    for module, name in imports(script):
        if module == "mrtf" or module.startswith("mrtf."):
            mod = importlib.import_module(module)
            if name is not None:
                assert hasattr(mod, name) or \
                    importlib.util.find_spec(f"{module}.{name}") is not None, \
                    f"{script.name}: {module} has no {name}"
                if script.parent == BENCH and name.startswith("_"):
                    assert name in TIMED_PRIVATE, f"{script.name} imports private {module}.{name}"
        elif module in LOCAL and name is not None:
            assert name in top_level_names(LOCAL[module]), \
                f"{script.name}: bench module {module} has no {name}"


def test_studies_are_listed_with_their_conclusion():
    listed = (BENCH / "studies" / "README.md").read_text(encoding="utf-8")
    for study in (BENCH / "studies").glob("*.py"):
        assert f"`{study.name}`" in listed, f"{study.name} is not in bench/studies/README.md"
