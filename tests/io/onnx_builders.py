"""Small ONNX files built on the fly for tests/io/test_onnx_models.py: a valid 4 → 3 linear
classifier, and hostile variants of it (each a few KB at most)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

META = {"mrtf.num_classes": "3", "mrtf.party": "linear"}


def linear_graph(nodes: list | None = None, inits: list | None = None, **kw) -> onnx.GraphProto:
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "w")
    base = [helper.make_node("MatMul", ["x", "w"], ["logits"])]
    return helper.make_graph(
        base + (nodes or []), "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 3])],
        [w] + (inits or []), **kw)


def save(path: Path, graph: onnx.GraphProto, meta: dict | None = META,
         opsets: tuple = (("", 17),), **model_kw) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets],
                              **model_kw)
    model.ir_version = 8
    for key, value in (meta or {}).items():
        model.metadata_props.add(key=key, value=value)
    path.write_bytes(model.SerializeToString())
    return path


def raw_tensor(name: str, dims: list[int], stored: int) -> onnx.TensorProto:
    """A float32 tensor that declares ``dims`` and stores ``stored`` values (helper.make_tensor
    refuses the mismatch; a hostile file need not)."""
    t = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT)
    t.dims.extend(dims)
    t.raw_data = b"\0" * (4 * stored)
    return t


def _huge_initializer(p: Path) -> Path:
    # declares 10^10 float32 values (40 GB) and stores 12
    t = raw_tensor("big", [100_000, 100_000], 12)
    return save(p, linear_graph(inits=[t]))


def _huge_constant(p: Path) -> Path:
    t = raw_tensor("c", [10**6, 10**6], 1)
    return save(p, linear_graph([helper.make_node("Constant", [], ["c"], value=t)]))


def _stores_less(p: Path) -> Path:
    t = raw_tensor("lying", [1000], 2)
    return save(p, linear_graph(inits=[t]))


def _custom_domain(p: Path) -> Path:
    node = helper.make_node("Evil", ["logits"], ["y"], domain="com.evil")
    return save(p, linear_graph([node]), opsets=(("", 17), ("com.evil", 1)))


def _external_data(p: Path) -> Path:
    t = helper.make_tensor("ext", TensorProto.FLOAT, [4], [0.0] * 4)
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="../../../etc/passwd")
    return save(p, linear_graph(inits=[t]))


def _branch() -> onnx.GraphProto:
    return helper.make_graph([helper.make_node("Identity", ["logits"], ["o"])], "b", [],
                             [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])


def _if(p: Path) -> Path:
    cond = numpy_helper.from_array(np.array(True), "cond")
    node = helper.make_node("If", ["cond"], ["y"], then_branch=_branch(), else_branch=_branch())
    return save(p, linear_graph([node], [cond]))


def _nested_graph_attribute(p: Path) -> Path:
    node = helper.make_node("Relu", ["logits"], ["y"], body=_branch())
    return save(p, linear_graph([node]))


def _loop(p: Path) -> Path:
    trip = numpy_helper.from_array(np.array(10**12, dtype=np.int64), "trip")
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, [])])
    node = helper.make_node("Loop", ["trip", ""], [], body=body)
    return save(p, linear_graph([node], [trip]))


def _scan(p: Path) -> Path:
    node = helper.make_node("Scan", ["logits"], ["y"], body=_branch(), num_scan_inputs=1)
    return save(p, linear_graph([node]))


def _constant_of_shape(p: Path) -> Path:
    shape = numpy_helper.from_array(np.array([10**6, 10**6], dtype=np.int64), "shape")
    node = helper.make_node("ConstantOfShape", ["shape"], ["zeros"])
    return save(p, linear_graph([node], [shape]))


def _too_many_nodes(p: Path) -> Path:
    nodes = [helper.make_node("Identity", ["logits"], [f"i{k}"]) for k in range(20_001)]
    return save(p, linear_graph(nodes))


def _local_function(p: Path) -> Path:
    fn = helper.make_function("local", "Twice", ["a"], ["b"],
                              [helper.make_node("Add", ["a", "a"], ["b"])],
                              [helper.make_opsetid("", 17)])
    node = helper.make_node("Twice", ["logits"], ["y"], domain="local")
    return save(p, linear_graph([node]), opsets=(("", 17), ("local", 1)), functions=[fn])


def _two_inputs(p: Path) -> Path:
    g = linear_graph()
    g.input.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 4]))
    return save(p, g)


def _not_onnx(p: Path) -> Path:
    p.write_bytes(b"\xff\xff\xff\xff not a protobuf at all")
    return p


def _no_metadata(p: Path) -> Path:
    return save(p, linear_graph(), meta=None)


def _metadata_twice(p: Path) -> Path:
    p.with_suffix(".json").write_text('{"mrtf.num_classes": 3}')
    return save(p, linear_graph())


def _doubling(p: Path) -> Path:
    # logits concatenated with itself 40 times: 3 · 2^40 values per sample from a 2 KB file
    nodes, last = [], "x"
    for k in range(40):
        nodes.append(helper.make_node("Concat", [last, last], [f"d{k}"], axis=1))
        last = f"d{k}"
    return save(p, _with_scores_from(linear_graph(nodes), last))


def _with_scores_from(g: onnx.GraphProto, name: str) -> onnx.GraphProto:
    """``g`` whose scores output (logits) also depends on tensor ``name``."""
    g.node[0].output[0] = "mm"
    red = helper.make_node("ReduceMax", [name], ["r"], keepdims=1)
    add = helper.make_node("Add", ["mm", "r"], ["logits"])
    g.node.extend([red, add])
    del g.output[1:]
    return g


def _quadratic(p: Path) -> Path:
    # the batch reshaped to a column times itself as a row: (4n)^2 values for n samples
    col = numpy_helper.from_array(np.array([-1, 1], dtype=np.int64), "col")
    row = numpy_helper.from_array(np.array([1, -1], dtype=np.int64), "row")
    nodes = [helper.make_node("Reshape", ["x", "col"], ["c"]),
             helper.make_node("Reshape", ["x", "row"], ["r0"]),
             helper.make_node("MatMul", ["c", "r0"], ["outer"])]
    return save(p, _with_scores_from(linear_graph(nodes, [col, row]), "outer"))


def _dynamic_input(p: Path) -> Path:
    g = linear_graph()
    g.input[0].type.tensor_type.shape.dim[1].dim_param = "d"
    return save(p, g)


#: (case id, builder, what the one-line error says)
HOSTILE: list[tuple[str, Callable[[Path], Path], str]] = [
    ("huge-initializer", _huge_initializer, "declares 10,000,000,000 values"),
    ("huge-constant", _huge_constant, "declares 1,000,000,000,000 values"),
    ("stores-less-than-declared", _stores_less, "declares 1,000 values but stores 2"),
    ("custom-domain", _custom_domain, "custom operator domain 'com.evil'"),
    ("external-data", _external_data, "external data file"),
    ("if-subgraph", _if, "control flow (If)"),
    ("nested-graph-attribute", _nested_graph_attribute, "nested sub-graph"),
    ("loop", _loop, "control flow (Loop)"),
    ("scan", _scan, "control flow (Scan)"),
    ("constant-of-shape", _constant_of_shape, "operator 'ConstantOfShape'"),
    ("too-many-nodes", _too_many_nodes, "more than the 20,000 allowed"),
    ("local-function", _local_function, "custom operator domain 'local'"),
    ("two-inputs", _two_inputs, "has 2 inputs"),
    ("concat-doubling", _doubling, "values per sample, more than the"),
    ("quadratic-in-batch", _quadratic, "grows faster than the batch"),
    ("dynamic-input", _dynamic_input, "input shape must be fixed"),
    ("not-onnx", _not_onnx, "not a readable ONNX model"),
    ("no-metadata", _no_metadata, "no mrtf.* metadata"),
    ("metadata-twice", _metadata_twice, "keep one of them"),
]
