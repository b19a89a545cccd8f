"""The structure checks (scripts/check_structure.py): no regression against the committed
baseline, and the checker itself finds what it claims to find."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_structure.py"

spec = importlib.util.spec_from_file_location("check_structure", SCRIPT)
check_structure = importlib.util.module_from_spec(spec)
sys.modules["check_structure"] = check_structure
spec.loader.exec_module(check_structure)


def test_no_regression_against_the_baseline():
    """A new cycle, upward import, long parameter list or long module fails; so does a
    baseline entry that is fixed (remove it: the baseline only shrinks)."""
    res = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True,
                         text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_checker_finds_each_kind_of_violation(tmp_path):
    root = _tree(tmp_path, {
        "mrtf/__init__.py": "",
        "mrtf/errors.py": "",
        "mrtf/io/__init__.py": "",
        # a function-level import still closes a cycle; TYPE_CHECKING imports never run
        "mrtf/io/a.py": "def f():\n    from mrtf.io import b\n",
        "mrtf/io/b.py": "from . import a\nfrom typing import TYPE_CHECKING\n"
                        "if TYPE_CHECKING:\n    from mrtf.refinery import c\n",
        "mrtf/refinery/__init__.py": "",
        "mrtf/refinery/c.py": "import mrtf.errors\n"
                              "def g(self, a, b, c, d, e, f, g, h, *args, _x=1, **kw):\n"
                              "    pass\n"
                              "class K:\n"
                              "    def m(self, a, b, c, d, e, f, g, h):\n        pass\n",
        "mrtf/trust/__init__.py": "",
        "mrtf/trust/d.py": "from mrtf.refinery.c import g\n" + "x = 1\n" * 401,
        "mrtf/refinery/e.py": "import mrtf.trust.d\n",
        "mrtf/io/up.py": "from mrtf.refinery import c\n",
        "mrtf/newthing.py": "",
    })
    report = check_structure.analyse(root)
    assert report.cycles == [["mrtf.io.a", "mrtf.io.b"],
                             ["package mrtf.refinery", "package mrtf.trust"]]
    assert "mrtf.io.a -> mrtf.io.b" in report.cycle_edges
    assert "package mrtf.io -> mrtf.refinery" not in report.cycle_edges
    assert report.upward == ["mrtf.io.up -> mrtf.refinery.c (inputs imports methods)",
                             "unlayered: mrtf.newthing"]
    assert report.params == {"mrtf.refinery.c:g": 9}  # the method's self does not count
    assert report.lines == {"mrtf/trust/d.py": 402}


def test_compare_lets_the_baseline_only_shrink(tmp_path):
    report = check_structure.Report([], ["mrtf.a -> mrtf.b", "mrtf.b -> mrtf.a"], [],
                                    {"mrtf.x:f": 10}, {"mrtf/y.py": 450})
    same = report.as_baseline()
    assert check_structure.compare(report, same) == []
    assert check_structure.compare(report, {**same, "params": {"mrtf.x:f": 12}}) == []
    grown = check_structure.compare(report, {**same, "lines": {"mrtf/y.py": 420}})
    assert grown == ["lines grew: mrtf/y.py has 450 lines, the baseline 420"]
    fixed = check_structure.compare(report, {**same, "upward": ["mrtf.io -> mrtf.cli"]})
    assert fixed == ["fixed upward (remove it from the baseline): mrtf.io -> mrtf.cli"]
    new = check_structure.compare(report, {**same, "cycle": ["mrtf.a -> mrtf.b"]})
    assert new == ["new cycle: mrtf.b -> mrtf.a"]
