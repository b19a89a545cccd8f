"""Flower engine: a ServerApp and a ClientApp on Flower's Message API that drive the strategies of
the in-process engine (``mrtf.federated.methods``) across real processes and machines.

Needs the optional extra ``flower`` (``pip install -e '.[flower]'``, Python >= 3.11). The
modules that do not talk to Flower (records' checks, the roster, selection) import without it.

``APP_DIR`` is a ready Flower App (a ``pyproject.toml`` naming the two apps and the run config's
defaults): ``flwr run $(python -c 'import mrtf.engines.flower as f; print(f.APP_DIR)') NAME``.
"""

from pathlib import Path

APP_DIR = Path(__file__).resolve().parent / "app"


def flwr_available() -> bool:
    """True when flwr is importable (the ``flower`` extra is installed)."""
    try:
        import flwr  # noqa: F401
    except ImportError:
        return False
    return True
