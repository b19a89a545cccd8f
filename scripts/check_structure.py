#!/usr/bin/env python3
"""Structure checks anyone can repeat: import cycles, upward imports, long parameter lists and
long modules in the installed package ``mrtf`` (``mrtf/``, plus ``cli/`` and ``data/``, which
install as ``mrtf.cli`` and ``mrtf.data``).

    python scripts/check_structure.py                   # report (counts and every violation)
    python scripts/check_structure.py --check           # compare with the committed baseline
    python scripts/check_structure.py --write-baseline  # after fixing some: shrink it

The rules, all read from the source with ``ast`` (nothing is imported):

* **cycle**: an import edge between two modules of one strongly connected component of the
  import graph. Every ``import``/``from ... import`` counts, at module level or inside a
  function (a function-level import still runs, and hiding a cycle there is still a cycle);
  only imports under ``if TYPE_CHECKING:`` are left out (they never run). ``from a.b import c``
  is an edge to ``a.b.c`` when that is a module, else to ``a.b``.
  The same rule on the graph of subpackages (``mrtf.refinery``, ``mrtf.trust``, ...) finds
  package cycles: trust importing refinery while refinery imports trust.
* **upward**: an import of a module in a higher layer of :data:`LAYERS` (DESIGN.md, "data
  flows one way": inputs -> methods -> jobs -> drivers). Imports within one layer are allowed
  (cycles are caught above); a module in no layer is a violation of its own (``unlayered``).
* **params**: a function or method with more than :data:`MAX_ARGS` parameters, counted as
  ruff's PLR0913 counts them (``self`` included, ``*args``/``**kwargs`` and names starting
  with ``_`` not).
* **lines**: a module of more than :data:`MAX_LINES` lines.

``--check`` fails (exit 1) on a violation the baseline does not list, on a count above the
baseline's (a longer module, more parameters), and on a baseline entry that is fixed: remove it
with ``--write-baseline``, which refuses to add entries unless given ``--allow-new`` (the
baseline only shrinks; a reviewer sees any ``--allow-new`` in the diff).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "tests" / "structure_baseline.json"
#: source folder -> the package it installs as (pyproject.toml, ``package-dir``)
SOURCES = {"mrtf": "mrtf", "cli": "mrtf.cli", "data": "mrtf.data"}
MAX_ARGS = 8  # ruff PLR0913 with max-args = 8
MAX_LINES = 400
#: ruff's default dummy-variable-rgx: such parameters do not count for PLR0913
DUMMY = re.compile(r"^(_+|(_+[a-zA-Z0-9_]*[a-zA-Z0-9]+?))$")

#: Layers, lowest first. A module may import its own layer and the layers below it. The
#: package root ``mrtf`` holds the version and the public names, loaded on first use; it
#: imports nothing at run time, so it sits at the bottom.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("mrtf", "mrtf.errors", "mrtf.device", "mrtf.host_memory", "mrtf.progress",
              "mrtf.schedule")),
    ("inputs", ("mrtf.io", "mrtf.models", "mrtf.data", "mrtf.scoring", "mrtf.averaging",
                "mrtf.compute")),
    ("methods", ("mrtf.refinery", "mrtf.trust", "mrtf.datafree")),
    ("jobs", ("mrtf.federated", "mrtf.labeling", "mrtf.jobs")),
    ("drivers", ("mrtf.engines", "mrtf.cli", "mrtf.__main__")),
]


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    tree: ast.Module
    lines: int
    imports: set[str] = field(default_factory=set)


def discover(root: Path = ROOT) -> dict[str, Module]:
    """Every module of the package, by dotted name."""
    modules: dict[str, Module] = {}
    for folder, package in SOURCES.items():
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts])
            text = path.read_text(encoding="utf-8")
            modules[name] = Module(name, path.relative_to(root), path.name == "__init__.py",
                                   ast.parse(text, str(path)), len(text.splitlines()))
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST):
    """Every Import/ImportFrom under ``node``, at any depth, except under TYPE_CHECKING."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            yield from (n for stmt in child.orelse for n in _import_nodes_of(stmt))
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from _import_nodes(child)


def _import_nodes_of(stmt: ast.AST):
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        yield stmt
    yield from _import_nodes(stmt)


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    base = base if module.is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def resolve_imports(modules: dict[str, Module]) -> None:
    """Fill each module's ``imports`` with the package's modules it imports."""
    for mod in modules.values():
        for node in _import_nodes(mod.tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _absolute(mod, node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            for target in targets:
                while target and target not in modules:  # import a.b.c -> nearest module
                    target = target.rpartition(".")[0]
                if target and target != mod.name:
                    mod.imports.add(target)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively; components of more than one module, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _top(name: str) -> str:
    """The subpackage a module belongs to: mrtf.refinery.teachers -> mrtf.refinery."""
    return ".".join(name.split(".")[:2])


def layer_of(name: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            # the root "mrtf" names itself only, not every module under it
            if name == prefix or (prefix != "mrtf" and name.startswith(prefix + ".")):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), rank)
    return None if best is None else best[1]


def count_params(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool = False) -> int:
    """Parameters as ruff's PLR0913 counts them: a method's ``self``/``cls`` does not count."""
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
    if method and not static and names and names[0] in ("self", "cls"):
        names = names[1:]
    return sum(1 for n in names if not DUMMY.match(n))


def _functions(node: ast.AST, prefix: str):
    """(qualified name, function, whether it is a method) for every function under node."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            qual = f"{prefix}{child.name}"
            yield qual, child, isinstance(node, ast.ClassDef)
            yield from _functions(child, qual + ".")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


@dataclass
class Report:
    cycles: list[list[str]]
    cycle_edges: list[str]
    upward: list[str]
    params: dict[str, int]
    lines: dict[str, int]

    def as_baseline(self) -> dict:
        return {"cycle": self.cycle_edges, "upward": self.upward, "params": self.params,
                "lines": self.lines}


def analyse(root: Path = ROOT) -> Report:
    modules = discover(root)
    resolve_imports(modules)
    graph = {name: mod.imports for name, mod in modules.items()}
    cycles = strongly_connected(graph)
    member = {name: i for i, comp in enumerate(cycles) for name in comp}
    cycle_edges = sorted(f"{a} -> {b}" for a in graph for b in graph[a]
                         if a in member and member.get(b) == member[a])
    # the same between subpackages (mrtf.refinery, mrtf.trust, ...): a module of trust that
    # imports refinery while refinery imports trust ties the two packages together
    packages: dict[str, set[str]] = {}
    for a, targets in graph.items():
        packages.setdefault(_top(a), set()).update(_top(b) for b in targets if _top(b) != _top(a))
    package_cycles = strongly_connected({p: packages.get(p, set()) for p in packages})
    member = {name: i for i, comp in enumerate(package_cycles) for name in comp}
    cycles += [[f"package {p}" for p in comp] for comp in package_cycles]
    cycle_edges += sorted(f"package {a} -> {b}" for a in packages for b in packages[a]
                          if a in member and member.get(b) == member[a])
    upward = []
    for name, mod in sorted(modules.items()):
        mine = layer_of(name)
        if mine is None:
            upward.append(f"unlayered: {name}")
            continue
        for target in sorted(mod.imports):
            theirs = layer_of(target)
            if theirs is not None and theirs > mine:
                upward.append(f"{name} -> {target} ({LAYERS[mine][0]} imports "
                              f"{LAYERS[theirs][0]})")
    params = {}
    for name, mod in sorted(modules.items()):
        for qual, fn, method in _functions(mod.tree, ""):
            n = count_params(fn, method)
            if n > MAX_ARGS and not any(_is_overload(d) for d in fn.decorator_list):
                params[f"{name}:{qual}"] = n
    lines = {str(m.path): m.lines for m in sorted(modules.values(), key=lambda m: str(m.path))
             if m.lines > MAX_LINES}
    return Report(cycles, cycle_edges, upward, dict(sorted(params.items())), lines)


def _is_overload(decorator: ast.expr) -> bool:
    return (isinstance(decorator, ast.Name) and decorator.id == "overload") or \
        (isinstance(decorator, ast.Attribute) and decorator.attr == "overload")


def compare(report: Report, baseline: dict) -> list[str]:
    """Every way ``report`` is worse than ``baseline`` or has fixed what it lists."""
    problems = []
    now = report.as_baseline()
    for kind in ("cycle", "upward"):
        listed = set(baseline.get(kind, []))
        problems += [f"new {kind}: {v}" for v in now[kind] if v not in listed]
        problems += [f"fixed {kind} (remove it from the baseline): {v}"
                     for v in sorted(listed - set(now[kind]))]
    for kind, what in (("params", "parameters"), ("lines", "lines")):
        listed = baseline.get(kind, {})
        for key, value in now[kind].items():
            if key not in listed:
                problems.append(f"new {kind}: {key} has {value} {what}")
            elif value > listed[key]:
                problems.append(f"{kind} grew: {key} has {value} {what}, the baseline "
                                f"{listed[key]}")
        problems += [f"fixed {kind} (remove it from the baseline): {key}"
                     for key in sorted(set(listed) - set(now[kind]))]
    return problems


def summary(report: Report) -> str:
    lines = [f"import cycles: {len(report.cycles)} (strongly connected components; "
             f"{len(report.cycle_edges)} import edges inside them)"]
    lines += [f"  cycle: {' <-> '.join(comp)}" for comp in report.cycles]
    lines += [f"upward imports: {len(report.upward)}"]
    lines += [f"  {v}" for v in report.upward]
    lines += [f"functions over {MAX_ARGS} parameters: {len(report.params)}"]
    lines += [f"  {k} ({v})" for k, v in report.params.items()]
    lines += [f"modules over {MAX_LINES} lines: {len(report.lines)}"]
    lines += [f"  {k} ({v})" for k, v in report.lines.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="fail on any difference from the baseline but a smaller count")
    parser.add_argument("--write-baseline", action="store_true",
                        help="write today's violations as the baseline (only removals)")
    parser.add_argument("--allow-new", action="store_true",
                        help="with --write-baseline: let the baseline grow")
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = analyse()
    print(json.dumps(report.as_baseline(), indent=1) if args.json else summary(report))
    if args.write_baseline:
        old = json.loads(args.baseline.read_text()) if args.baseline.exists() else None
        grown = [p for p in compare(report, old) if not p.startswith("fixed")] if old else []
        if grown and not args.allow_new:
            print("refusing to grow the baseline (--allow-new to do it anyway):",
                  *grown, sep="\n  ", file=sys.stderr)
            return 1
        args.baseline.write_text(json.dumps(report.as_baseline(), indent=1) + "\n")
        print(f"wrote {args.baseline}")
    if args.check:
        problems = compare(report, json.loads(args.baseline.read_text()))
        if problems:
            print(f"structure check against {args.baseline.name} failed:", *problems,
                  sep="\n  ", file=sys.stderr)
            return 1
        print(f"structure check: no regression against {args.baseline.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
