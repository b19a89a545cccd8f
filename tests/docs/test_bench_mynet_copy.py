"""bench/models/mynet.py, the model of the independent-starts benchmark
(docs/benchmarks/takeover.md), is the user's ``mynet.py`` of docs/your-own-models.md as
written there: the measurement is of the documented model."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_bench_model_is_the_documented_one():
    doc = (ROOT / "docs" / "your-own-models.md").read_text()
    block = re.search(r"<!-- file: mynet.py -->\n```python\n(.*?)^```", doc, re.S | re.M)
    assert block is not None
    bench = ast.parse((ROOT / "bench" / "models" / "mynet.py").read_text())
    bench.body = bench.body[1:]  # its docstring, which says where it comes from
    assert ast.dump(bench) == ast.dump(ast.parse(block[1]))
