"""Received ONNX models, checked before onnxruntime sees them: code-free parties.

A party on another framework (Keras, JAX, scikit-learn through skl2onnx, or PyTorch through
``torch.onnx.export``) sends an ``.onnx`` file. Nothing of the party's code runs: the graph is
parsed as data and refused, before a session is created, when it holds anything but the
standard operators a classifier needs: operators of other domains (custom kernels), model-local
functions, control flow (Loop, If, Scan) or any sub-graph, tensors in external data files,
initializers or constants beyond the size bounds of every received file (mrtf/io/limits.py),
more than :data:`MAX_NODES` nodes, or operators whose output size is read from the data
(ConstantOfShape, Expand, Tile, Range, Resize, Pad: a small file asking for terabytes); and
then any tensor whose size does not follow from the input's shape or exceeds the bounds of
mrtf/io/onnx_bounds.py (a graph that multiplies its activations).

Metadata: the same ``mrtf.*`` keys as a safetensors header, in the model's ``metadata_props``
or, when it has none, in a ``.json`` sidecar of the same name (docs/your-own-models.md).
``mrtf.arch`` is not needed: an ONNX file is its own architecture (``onnx``), never averaged.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from mrtf.errors import InputError, first_line
from mrtf.io.limits import MAX_FILE_BYTES, MAX_PARAMS, check_regular_file
from mrtf.io.onnx_bounds import onnx_module, pruned, rows_per_call
from mrtf.io.readers import read_sidecar
from mrtf.models.onnx_teacher import OnnxOutputs, OnnxTeacher, onnx_teacher

ONNX_ARCH = "onnx"
MAX_NODES = 20_000
_STANDARD = ("", "ai.onnx")
_ML = "ai.onnx.ml"
# Operators of a feed-forward classifier whose outputs are no larger than their inputs and
# initializers (so the file's size bounds the memory a run takes).
_OPS = frozenset("""
Abs Acos Add And ArgMax ArgMin Asin Atan AveragePool BatchNormalization Cast Ceil Celu Clip
Concat Constant Conv ConvTranspose Cos DepthToSpace Div Dropout Einsum Elu Equal Erf Exp
Flatten Floor Gather GatherElements Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool
Greater GreaterOrEqual GroupNormalization HardSigmoid HardSwish Identity InstanceNormalization
IsInf IsNaN LRN LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax LpNormalization
LpPool MatMul Max MaxPool Mean Min Mish Mod Mul Neg Not Or PRelu Pow Reciprocal ReduceL1
ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum
ReduceSumSquare Relu Reshape Round Selu Shape Shrink Sigmoid Sign Sin Size Slice Softmax
Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Transpose
Trilu Unsqueeze Where Xor
""".split())
_ML_OPS = frozenset("""
ArrayFeatureExtractor Binarizer LabelEncoder LinearClassifier Normalizer Scaler ZipMap
""".split())
_CONTROL_FLOW = frozenset({"Loop", "If", "Scan"})
# TensorProto data types an initializer may have (no strings, no 4/8-bit floats)
_DTYPES = {1: 4, 2: 1, 3: 1, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}
_FLOAT = 1  # TensorProto.FLOAT
_EXTERNAL = 1  # TensorProto.EXTERNAL: the data lives in another file
_GRAPH_ATTRIBUTES = (5, 10)  # AttributeProto.GRAPH, AttributeProto.GRAPHS


@dataclass
class CheckedOnnx:
    """A parsed graph that passed the checks, and the session to run it (made once)."""

    path: Path
    model: Any  # onnx.ModelProto, with the outputs it is run for
    outputs: OnnxOutputs
    sha256: str
    values: int  # stored values: initializers and constants (its "parameters")
    notes: list[str] = field(default_factory=list)
    _session: Any = None

    def teacher(self, num_classes: int) -> OnnxTeacher:
        if self._session is None:
            self._session = _session(self.path, self.model)
        return onnx_teacher(self._session, self.outputs, num_classes, self.path.name)


def read_onnx(p: Path) -> tuple[dict[str, str], CheckedOnnx]:
    """(``mrtf.*`` header keys, the checked graph) of a received ``.onnx`` file; InputError
    naming ``p`` for anything refused. Metadata comes from ``metadata_props``, else from the
    ``.json`` sidecar."""
    try:
        model = onnx_module("onnx").ModelProto()
        onnx_module("onnxruntime")
    except InputError as exc:
        raise InputError(f"{p}: {exc}") from None
    check_regular_file(p, "model file", MAX_FILE_BYTES)
    data = p.read_bytes()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise InputError(f"{p}: not a readable ONNX model ({first_line(exc, 100)})") from None
    try:
        values = check_graph(model)
        outputs = choose_outputs(model)
        # cut to what the used outputs need, then bound every tensor's size (onnx_bounds.py)
        model = pruned(model, [n for n in (outputs.scores, outputs.features) if n])
        outputs = replace(outputs, rows_per_call=rows_per_call(model, outputs.input_name))
    except InputError as exc:
        raise InputError(f"{p}: {exc}") from None
    head = {kv.key: kv.value for kv in model.metadata_props if kv.key.startswith("mrtf.")}
    sidecar = p.with_suffix(".json")
    if sidecar.exists() or sidecar.is_symlink():
        if head:
            raise InputError(f"{p}: mrtf.* keys both in the file's metadata_props and in "
                             f"{sidecar.name}; keep one of them")
        head = read_sidecar(sidecar)
    if not head:
        raise InputError(f"{p}: no mrtf.* metadata: put mrtf.num_classes (and the other keys) "
                         f"in the model's metadata_props or in a {sidecar.name} sidecar")
    notes = []
    said = head.get("mrtf.arch")
    if said is not None and said != ONNX_ARCH:
        notes.append(f"mrtf.arch {said[:40]!r} ignored: an ONNX file is run as its graph")
    # each file is its own architecture (its graph), told apart by its hash
    sha = hashlib.sha256(data).hexdigest()
    head = {**head, "mrtf.arch": ONNX_ARCH, "mrtf.arch_kwargs": json.dumps({"sha256": sha[:16]})}
    return head, CheckedOnnx(p, model, outputs, sha, values, notes)


def check_graph(model: Any) -> int:
    """Refuse what could run code, read other files or take unbounded memory (module doc);
    returns the number of stored values (initializers and constants)."""
    domains = {o.domain for o in model.opset_import} - set(_STANDARD) - {_ML}
    if domains:
        raise InputError(f"uses custom operator domain {sorted(domains)[0][:40]!r}; only the "
                         "standard ONNX operators run (no custom kernels)")
    if len(model.functions) or len(model.training_info):
        raise InputError("defines model-local functions or training graphs; only a plain "
                         "inference graph is run")
    graph = model.graph
    if len(graph.node) > MAX_NODES:
        raise InputError(f"has {len(graph.node):,} nodes, more than the {MAX_NODES:,} allowed")
    if len(graph.sparse_initializer):
        raise InputError("has sparse initializers; export dense weights")
    total = 0
    for t in graph.initializer:
        total += _tensor_size(t, "initializer")
    for node in graph.node:
        _check_node(node)
        for a in node.attribute:
            for t in ([a.t] if a.HasField("t") else []) + list(a.tensors):
                total += _tensor_size(t, f"constant of {node.op_type} node")
        if total > MAX_PARAMS:
            break
    if total > MAX_PARAMS:
        raise InputError(f"its initializers and constants declare {total:,} values, more "
                         f"than the {MAX_PARAMS:,} allowed for a received model")
    return total


def _check_node(node: Any) -> None:
    op, domain = node.op_type, node.domain
    if op in _CONTROL_FLOW:
        raise InputError(f"uses control flow ({op}); only feed-forward graphs are run")
    if any(a.type in _GRAPH_ATTRIBUTES
           or a.HasField("g") or len(a.graphs) for a in node.attribute):
        raise InputError(f"node {op[:40]!r} holds a nested sub-graph; only flat graphs are run")
    if any(a.HasField("sparse_tensor") or len(a.sparse_tensors) for a in node.attribute):
        raise InputError(f"node {op[:40]!r} holds a sparse tensor; export dense constants")
    if domain in _STANDARD:
        allowed = op in _OPS
    elif domain == _ML:
        allowed = op in _ML_OPS
    else:
        raise InputError(f"node {op[:40]!r} is of custom operator domain {domain[:40]!r}; only the "
                         "standard ONNX operators run (no custom kernels)")
    if not allowed:
        raise InputError(f"uses operator {op[:40]!r}, which mrtf does not run for a received "
                         "model (its output size is read from the data, or it is not a "
                         "classifier's operator)")


def _tensor_size(t: Any, what: str) -> int:
    """Element count of a stored tensor, refused when it lives in an external file, has an
    unaccepted type, declares more values than the bound, or stores other than it declares."""
    if t.data_location == _EXTERNAL or len(t.external_data):
        raise InputError(f"{what} {t.name[:40]!r} is stored in an external data file; "
                         "received models must be self-contained (save with all tensors in "
                         "the .onnx file)")
    if t.data_type not in _DTYPES:
        raise InputError(f"{what} {t.name[:40]!r} has an unsupported data type "
                         f"({t.data_type})")
    if any(d < 0 for d in t.dims):
        raise InputError(f"{what} {t.name[:40]!r} has a negative dimension")
    n = math.prod(t.dims)
    if n > MAX_PARAMS:
        raise InputError(f"{what} {t.name[:40]!r} declares {n:,} values, more than the "
                         f"{MAX_PARAMS:,} allowed for a received model")
    if t.HasField("raw_data"):
        stored = len(t.raw_data) // _DTYPES[t.data_type]
    else:
        stored = max(len(t.float_data), len(t.int32_data), len(t.int64_data),
                     len(t.double_data), len(t.uint64_data))
    if stored != n:
        raise InputError(f"{what} {t.name[:40]!r} declares {n:,} values but stores "
                         f"{stored:,}")
    return n


def choose_outputs(model: Any) -> OnnxOutputs:
    """The graph's input and which outputs are the class scores and the features.

    Scores: the output named ``logits``, else one whose name contains ``prob``
    (probabilities, e.g. skl2onnx's; a ZipMap's dictionaries are read from its input tensor),
    else the only output. Features: an output named ``features``, else none."""
    graph = model.graph
    stored = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in stored]
    if len(inputs) != 1:
        raise InputError(f"has {len(inputs)} inputs; a received classifier takes one batch")
    tensor = inputs[0].type.tensor_type
    if not inputs[0].type.HasField("tensor_type") or tensor.elem_type != _FLOAT:
        raise InputError("its input is not a float32 tensor; export it with float32 inputs")
    dims = tensor.shape.dim
    batch = dims[0].dim_value if len(dims) and dims[0].HasField("dim_value") else None
    names = [o.name for o in graph.output]
    probs = [n for n in names if "prob" in n.lower()]
    if "logits" in names:
        scores, kind = "logits", "logits"
    elif probs:
        scores, kind = _unzipped(model, probs[0]), "probabilities"
    elif len(names) == 1 or (len(names) == 2 and "features" in names):
        scores, kind = next(n for n in names if n != "features"), "logits"
    else:
        raise InputError(f"cannot tell which of its outputs {names[:6]} are the class scores: "
                         "name it 'logits' (or 'probabilities')")
    features = "features" if "features" in names else None
    return OnnxOutputs(inputs[0].name, scores, kind, features, batch or None)


def _unzipped(model: Any, name: str) -> str:
    """A ZipMap's output (a list of dictionaries) is read as the tensor it zips (the graph is
    then cut to end there)."""
    node = next((n for n in model.graph.node if name in n.output), None)
    if node is None or node.op_type != "ZipMap":
        return name
    return node.input[0]


def _session(p: Path, model: Any) -> Any:
    """An onnxruntime CPU session of the checked graph (from bytes: no path to resolve
    external files against), with torch's thread count (deterministic per machine)."""
    onnxruntime = onnx_module("onnxruntime")
    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = max(1, torch.get_num_threads())
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3  # errors only: the one line below says what went wrong
    try:
        return onnxruntime.InferenceSession(model.SerializeToString(), opts,
                                            providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own exception types
        raise InputError(f"{p}: onnxruntime cannot run it ({first_line(exc, 120)})") from None
