"""The real standard datasets (``../shared/data`` beside the repository, as in CI), loaded at
most once per session, and a private user cache so tests never touch ~/.cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mrtf.data import load_standard

SHARED_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


@pytest.fixture(scope="session", autouse=True)
def _private_user_cache(tmp_path_factory):
    """Verifications are remembered under $XDG_CACHE_HOME: point it at a temporary folder."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "SHA256SUMS").is_file():
        pytest.fail(f"{SHARED_DATA.resolve()}: the offline copies of the standard datasets "
                    "are missing (CI checks them out beside the repository)")
    return SHARED_DATA.resolve()


@pytest.fixture(scope="session")
def standard(shared_data):
    """``standard("mnist", "train")``: each split decoded once for the whole session."""
    loaded: dict = {}

    def load(name: str, split: str = "test"):
        if (name, split) not in loaded:
            loaded[name, split] = load_standard(name, split, data_dir=shared_data)
        return loaded[name, split]

    return load
