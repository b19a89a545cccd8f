"""Does a model take the data's images? One forward on one sample, and when it does not, a
message that says which shape the model expects and the ``mrtf convert`` that makes it."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from mrtf.errors import InputError, first_line


def expected_shape(arch_kwargs: dict[str, Any]) -> tuple[int, int] | None:
    """(channels, image size) an image model was built for, from its ``mrtf.arch_kwargs``."""
    c, s = arch_kwargs.get("in_channels"), arch_kwargs.get("image_size")
    if isinstance(c, int) and isinstance(s, int):
        return c, s
    return None


def convert_hint(arch_kwargs: dict[str, Any], sample_shape: tuple[int, ...]) -> str:
    """What to do when the data's shape does not fit: the convert flags that make it fit."""
    want = expected_shape(arch_kwargs)
    if isinstance(arch_kwargs.get("in_features"), int):
        return (f"the model expects feature vectors of length {arch_kwargs['in_features']} "
                "(x of shape (M, D))")
    if want is None:
        return "convert the data to the shape the received models were trained on"
    c, s = want
    flags = []
    if len(sample_shape) != 3 or sample_shape[-1] != s or sample_shape[-2] != s:
        flags.append(f"--image-size {s}")
    if len(sample_shape) != 3 or sample_shape[0] != c:
        flags.append(f"--channels {c}")
    return (f"the model expects {c}×{s}×{s} images; re-create the data with `mrtf convert "
            f"SOURCE OUT.h5 {' '.join(flags) or f'--image-size {s} --channels {c}'}`")


def check_model_fits(model: nn.Module, name: str, source: Any, num_classes: int,
                     arch_kwargs: dict[str, Any]) -> None:
    """One forward on the first sample of ``source``: InputError (ending with the fix) when the
    images do not fit ``model`` or it predicts another number of classes."""
    shape = tuple(source.sample_shape)
    where = getattr(getattr(source, "path", None), "name", "the data")
    x = torch.from_numpy(np.ascontiguousarray(source.read(0, 1)))
    try:
        with torch.inference_mode():
            logits = model.eval()(x)
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        what = "images" if len(shape) == 3 else "samples"
        raise InputError(f"{where}: {what} of shape {'×'.join(map(str, shape))} do "
                         f"not fit model {name} ({first_line(exc, 100)}); "
                         f"{convert_hint(arch_kwargs, shape)}") from None
    if logits.dim() != 2 or logits.shape[1] != num_classes:
        raise InputError(f"{name} predicts {tuple(logits.shape[1:])} classes but the received "
                         f"models have {num_classes}; receive models of one task only")
