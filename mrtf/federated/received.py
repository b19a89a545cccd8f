"""What a pilot party receives from a round, as a :class:`~mrtf.io.bundles.ReceivedSet`: one
constructor for the in-loop refinery, the export of a simulation and the benchmarks.

The models are named by the files :func:`write_received` gives them (``client-003.safetensors``,
``global-start.safetensors``), so a set built in memory and the same set read back from its
directory carry the same paths and names.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from mrtf.errors import InputError
from mrtf.io.bundles import BundleMeta, ReceivedModel, ReceivedSet, save_bundle

if TYPE_CHECKING:  # strategies import this module: no import of theirs at run time
    from mrtf.federated.strategies.base import ClientUpdate

GLOBAL_FILE = "global-start.safetensors"


def client_file(k: int) -> str:
    return f"client-{k:03d}.safetensors"


def received_set(rnd: int, start_state: dict[str, torch.Tensor] | None,
                 updates: Sequence[ClientUpdate], *, arch: str, num_classes: int,
                 arch_kwargs: dict, earlier: Mapping[int, tuple[int, ClientUpdate]] | None = None,
                 extra: dict[str, str] | None = None) -> ReceivedSet:
    """Round ``rnd``'s client states (role ``local``) and the global model θ_t they started
    from (role ``global``, left out when ``start_state`` is None).

    ``earlier``: client → (round, update) of clients that last trained in an earlier round;
    each adds its latest model with its own round (FedKF's OCA teacher uses them, the refinery
    only the newest round). Models are in client order, θ_t last.
    """
    base = dict(arch=arch, num_classes=num_classes, arch_kwargs=arch_kwargs,
                extra=dict(extra or {}))
    newest = {u.client: (rnd, u) for u in updates}
    chosen = {**(earlier or {}), **newest}
    models = []
    for k, (r, u) in sorted(chosen.items()):
        loss = u.train_loss if np.isfinite(u.train_loss) else None
        meta = BundleMeta(**base, round=r, party=f"client-{k:03d}",
                          label_counts=list(u.label_counts), n_samples=u.n_samples,
                          train_loss=loss, role="local")
        models.append(ReceivedModel(Path(client_file(k)), meta, u.state))
    if start_state is not None:
        models.append(ReceivedModel(Path(GLOBAL_FILE), BundleMeta(
            **base, round=rnd, party="server", role="global"), start_state))
    return ReceivedSet(models, [])


def check_received_dir(out: Path, force: bool) -> None:
    """Refuse a non-empty output directory unless ``force``; never delete non-model files."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise InputError(f"{out} is not empty; choose a new directory or pass --force")
        others = [f.name for f in out.iterdir() if f.suffix not in (".safetensors", ".pt",
                                                                     ".json")]
        if others:
            raise InputError(f"{out} holds files other than models ({others[0]}, ...); "
                             "refusing to replace it")


def write_received(received: ReceivedSet, directory: str | os.PathLike,
                   force: bool = False) -> list[Path]:
    """Write every model of ``received`` as a bundle named by its path into ``directory``.

    The files are written into a temporary folder beside it and renamed into place, so an
    interrupted export leaves nothing half-written. An existing non-empty ``directory`` is
    refused unless ``force`` (and then only if it holds nothing but model files).
    """
    out = Path(directory)
    check_received_dir(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for m in received.models:
            save_bundle(tmp / m.path.name, m.state_dict, m.meta)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [out / m.path.name for m in received.models]
