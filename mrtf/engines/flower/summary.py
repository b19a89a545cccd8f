"""The Flower run's JSON files (``summary.json``), written atomically; shared by the train
mode (server_app.py) and the pilot mode (pilot.py)."""

from __future__ import annotations

import json
from pathlib import Path

from mrtf.io.atomic import atomic_path


def write_json(path: Path, data: dict) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
