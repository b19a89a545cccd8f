"""How much memory a received ONNX graph can take, known before it runs.

The operators mrtf runs (mrtf/io/onnx_files.py) have outputs whose sizes follow from their
inputs' shapes, but a graph can still multiply them: concatenate a tensor with itself thirty
times, or reshape a batch into a column and multiply it by its own row. So the graph is first
cut to what the used outputs need (a label branch or a ZipMap never runs), then ONNX shape
inference runs on it for one sample (the batch fixed to 1; the other input dimensions must be
fixed): every tensor's shape must be known, none may exceed what one input sample may hold,
and all of them together at most :data:`MAX_SAMPLE_ACTIVATIONS`. The session is then called on
at most :data:`MAX_CALL_VALUES` / (values per sample) rows at a time, so a run's memory is
bounded whatever the target set's size.
"""

from __future__ import annotations

import importlib
import math
from types import ModuleType
from typing import Any

from mrtf.errors import InputError, first_line
from mrtf.io.limits import MAX_SAMPLE_VALUES

#: values all tensors of one sample may hold together (its activations)
MAX_SAMPLE_ACTIVATIONS = 16 * MAX_SAMPLE_VALUES
#: values all tensors of one session call may hold together (float32: 1 GiB)
MAX_CALL_VALUES = 1 << 28


def onnx_module(name: str = "onnx") -> ModuleType:
    """A module of the optional extra (onnx, onnx.shape_inference, onnxruntime), imported at
    the first .onnx file: importing onnx takes ~0.5 s that no other command should pay."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise InputError("reading ONNX models needs the onnx extra: pip install "
                         "'mrtf[onnx]' (onnx and onnxruntime)") from None


def pruned(model: Any, keep: list[str]) -> Any:
    """A copy of ``model`` with only the nodes and initializers the outputs ``keep`` depend on,
    and those outputs (float tensors) as its outputs."""
    graph = model.graph
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output}
    needed: set[int] = set()
    stack = list(keep)
    while stack:
        i = producer.get(stack.pop())
        if i is not None and i not in needed:
            needed.add(i)
            stack.extend(graph.node[i].input)
    nodes = [graph.node[i] for i in sorted(needed)]
    used = {name for n in nodes for name in n.input} | set(keep)
    out = type(model)()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    inits = [t for t in graph.initializer if t.name in used]
    del out.graph.initializer[:]
    out.graph.initializer.extend(inits)
    del out.graph.output[:]
    for name in keep:
        value = out.graph.output.add()
        value.name = name
        value.type.tensor_type.elem_type = 1  # TensorProto.FLOAT
    del out.graph.value_info[:]
    return out


def rows_per_call(model: Any, input_name: str) -> int:
    """How many samples one session call may take: every tensor of the graph has a shape
    known from the input's, within the bounds above, and grows no faster than the batch (a
    tensor 4× larger for 2 samples than for 1 would be 10^6× larger for 1,000); InputError
    otherwise. A graph exported for a fixed batch is checked at that batch."""
    dims = _input_dims(model, input_name)
    fixed = dims[0].dim_value if dims[0].HasField("dim_value") and dims[0].dim_value else None
    one = _sizes(model, input_name, fixed or 1)
    batch = fixed or 1
    if fixed is None:
        two = _sizes(model, input_name, 2)
        for name, (op, n) in one.items():
            if two[name][1] > 2 * n:
                raise InputError(f"{name[:40]!r} ({op}) grows faster than the batch (it mixes "
                                 "samples); mrtf runs only graphs that treat samples apart")
    for name, (op, n) in one.items():
        if n > MAX_SAMPLE_VALUES * batch:
            raise InputError(f"{name[:40]!r} ({op}) holds {n // batch:,} values per sample, "
                             f"more than the {MAX_SAMPLE_VALUES:,} allowed")
    per_sample = max(1, (math.prod(d.dim_value for d in dims[1:]) * batch
                         + sum(n for _, n in one.values())) // batch)
    if per_sample > MAX_SAMPLE_ACTIVATIONS:
        raise InputError(f"its tensors hold {per_sample:,} values per sample, more than the "
                         f"{MAX_SAMPLE_ACTIVATIONS:,} allowed")
    return max(1, MAX_CALL_VALUES // per_sample)


def _input_dims(model: Any, input_name: str) -> Any:
    inp = next(i for i in model.graph.input if i.name == input_name)
    dims = inp.type.tensor_type.shape.dim
    if not len(dims) or any(not d.HasField("dim_value") for d in dims[1:]):
        raise InputError("its input shape must be fixed apart from the batch dimension "
                         "(export it for the data's sample shape)")
    return dims


def _sizes(model: Any, input_name: str, batch: int) -> dict[str, tuple[str, int]]:
    """Every node output's (operator, element count) for a batch of ``batch`` samples, by ONNX
    shape inference; InputError when one cannot be known."""
    probe = type(model)()
    probe.CopyFrom(model)
    _input_dims(probe, input_name)[0].dim_value = batch
    inference = onnx_module("onnx.shape_inference")
    try:
        inferred = inference.infer_shapes(probe, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - onnx's inference raises its own types
        raise InputError(f"its shapes cannot be inferred ({first_line(exc, 100)})") from None
    known = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output)}
    sizes = {}
    for node in inferred.graph.node:
        for name in filter(None, node.output):
            n = _values(known.get(name))
            if n is None:
                raise InputError(f"the size of {name[:40]!r} ({node.op_type}) cannot be told "
                                 "before running the graph; mrtf runs only graphs whose "
                                 "tensor sizes follow from the input's shape")
            sizes[name] = (node.op_type, n)
    return sizes


def _values(info: Any) -> int | None:
    """Element count of a value's inferred shape; None when not a tensor or not known."""
    if info is None or not info.type.HasField("tensor_type"):
        return None
    shape = info.type.tensor_type
    if not shape.HasField("shape"):
        return None
    dims = shape.shape.dim
    if any(not d.HasField("dim_value") for d in dims):
        return None
    return math.prod(d.dim_value for d in dims)
