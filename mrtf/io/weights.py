"""A received state dict against its architecture: keys, shapes, dtypes and values.

Shapes and dtypes are compared from the file's header (safetensors) before the weights are
read, so a file that declares the wrong tensors costs nothing to refuse. Values are checked
after loading: finite, and small enough that a forward pass in float32 cannot overflow.

dtype policy (README "Formats"): float32 is taken as is; float16, bfloat16 and float64 are
converted to float32 with a note (values beyond float32's range are refused, not turned into
inf); integer, bool and 8-bit float weights are refused, because reading them as floats gives
a different model. Integer buffers (``num_batches_tracked``) must be integers.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mrtf.errors import InputError
from mrtf.io.limits import CONVERTED_DTYPES, MAX_ABS_WEIGHT

Shapes = dict[str, tuple[tuple[int, ...], torch.dtype]]

# safetensors' dtype names → torch dtypes (those torch knows; others are refused by name)
ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
             "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
             "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def check_against_reference(p: Path, arch: str, num_classes: int, found: Shapes,
                            ref: Shapes) -> None:
    """Same keys, same shapes, acceptable dtypes; raises InputError naming ``p``."""
    missing, unexpected = sorted(set(ref) - set(found)), sorted(set(found) - set(ref))
    if missing or unexpected:
        what = [f"missing {', '.join(missing[:3])}" if missing else "",
                f"unexpected {', '.join(unexpected[:3])}" if unexpected else ""]
        hint = ""
        if found and all(k.startswith("module.") for k in found) and \
                {k.removeprefix("module.") for k in found} == set(ref):
            hint = (" (saved from nn.DataParallel or DistributedDataParallel: save "
                    "model.module.state_dict() instead)")
        raise InputError(f"{p}: weights do not match {arch!r}: "
                         + "; ".join(w for w in what if w) + hint)
    for key, (shape, dtype) in found.items():
        ref_shape, ref_dtype = ref[key]
        if tuple(shape) != tuple(ref_shape):
            raise InputError(f"{p}: {key} has shape {tuple(shape)}, {arch!r} with "
                             f"{num_classes} classes needs {tuple(ref_shape)}")
        if ref_dtype.is_floating_point:
            if dtype is None or not (dtype == torch.float32 or dtype in CONVERTED_DTYPES):
                raise InputError(
                    f"{p}: {key} is stored as {_name(dtype)}; weights must be floating point "
                    "(float32, or float16/bfloat16/float64, converted)")
        elif dtype is None or dtype.is_floating_point or dtype == torch.bool:
            raise InputError(f"{p}: {key} is stored as {_name(dtype)}; it must be an integer")


def _name(dtype: torch.dtype | None) -> str:
    return "an unsupported dtype" if dtype is None else str(dtype).removeprefix("torch.")


def normalise_weights(p: Path, state: dict[str, torch.Tensor], ref: Shapes
                      ) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Finite, bounded values in the architecture's dtypes; returns (state, notes)."""
    out: dict[str, torch.Tensor] = {}
    converted: set[str] = set()
    for key, tensor in state.items():
        ref_dtype = ref[key][1]
        if tensor.is_floating_point():
            if not bool(torch.isfinite(tensor).all()):
                raise InputError(f"{p}: {key} holds NaN or infinite values")
            peak = float(tensor.abs().max()) if tensor.numel() else 0.0
            if peak > MAX_ABS_WEIGHT:
                raise InputError(f"{p}: {key} holds values up to {peak:.3g}, beyond the "
                                 f"±{MAX_ABS_WEIGHT:.0e} a trained model uses (float32 "
                                 "activations would overflow)")
            if tensor.dtype != ref_dtype:
                converted.add(_name(tensor.dtype))
        out[key] = tensor.to(ref_dtype) if tensor.dtype != ref_dtype else tensor
    notes = [f"weights stored as {', '.join(sorted(converted))} were converted to float32"
             ] if converted else []
    return out, notes
