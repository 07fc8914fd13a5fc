"""The one index every ONNX rewrite reads its graph through
(exirc.runtime.engines.onnx_form.graph_index): producers, readers per input slot
(a graph output counted apart), constants as read-only numpy (an initializer that
is also a graph input is not one), one-element float32 scalars, fresh names apart
from the graph's, re-indexing after a rewrite and writing the graph back; static
shapes refused for a graph with subgraphs; the fixed-point loop counts rewrites and
calls a rewrite that outruns its termination bound a bug."""

from __future__ import annotations

from typing import Any

import numpy
import pytest

from exirc.errors import InternalError
from exirc.runtime.engines.onnx_form.graph_index import (
    GraphIndex,
    has_subgraphs,
    static_shapes,
    until_fixed_point,
)

onnx = pytest.importorskip("onnx")


def small_model() -> Any:
    """y = Relu(x * scale) + Relu(x * scale) (one Relu read twice by the Add), x * scale
    also an output; `scale` a float32 one-element constant, `bias` an initializer that
    is also a graph input (a default), `unused` an initializer nothing reads."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Mul", ["x", "scale"], ["scaled"]),
             helper.make_node("Relu", ["scaled"], ["relu"]),
             helper.make_node("Add", ["relu", "relu"], ["sum"]),
             helper.make_node("Add", ["sum", "bias"], ["y"])]
    initializers = [numpy_helper.from_array(numpy.asarray([2.0], numpy.float32), "scale"),
                    numpy_helper.from_array(numpy.zeros((2, 3), numpy.float32), "bias"),
                    numpy_helper.from_array(numpy.arange(4, dtype=numpy.int64), "unused")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
              helper.make_tensor_value_info("bias", TensorProto.FLOAT, [2, 3])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
               helper.make_tensor_value_info("scaled", TensorProto.FLOAT, [2, 3])]
    graph = helper.make_graph(nodes, "small", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_producers_and_readers_by_input_slot() -> None:
    graph = small_model().graph
    index = GraphIndex(graph, graph.node)
    mul, relu, first_add, second_add = graph.node
    assert index.producer("relu") is relu and index.producer("x") is None
    assert index.made_by("relu", "Relu") is relu and index.made_by("relu", "Add") is None
    assert list(index.readers("relu")) == [first_add, first_add]  # one entry per slot
    assert list(index.readers("y")) == [] and list(index.readers("nothing")) == []
    assert index.reader_count("relu") == 2
    assert index.reader_count("scaled") == 2  # the Relu, and the graph's output
    assert index.reader_count("y") == 1  # the graph's output alone
    assert index.sole_reader("sum") is second_add
    assert index.sole_reader("relu") is None  # read twice by one node
    assert index.sole_reader("scaled") is None  # read by one node, but also an output
    assert index.sole_reader("y") is None
    assert index.inputs == {"x", "bias"} and index.outputs == {"y", "scaled"}


def test_constants_are_numpy_read_only_and_exclude_inputs() -> None:
    graph = small_model().graph
    index = GraphIndex(graph, graph.node)
    scale = index.constant("scale")
    assert scale is not None and scale.tolist() == [2.0] and not scale.flags.writeable
    assert index.constant("scale") is scale  # converted once
    assert index.scalar("scale") == 2.0
    # An initializer that is also a graph input is its default value, not a constant.
    assert index.initializer("bias") is None and index.constant("bias") is None
    assert index.scalar("bias") is None
    assert index.constant("unused") is not None and index.scalar("unused") is None  # int64
    assert index.constant("x") is None and index.constant("relu") is None


def test_refresh_after_a_rewrite() -> None:
    graph = small_model().graph
    index = GraphIndex(graph, graph.node)
    mul, relu, first_add, second_add = graph.node
    index.nodes.remove(relu)  # a rewrite drops the Relu, the Add reads `scaled`
    first_add.input[:] = ["scaled", "scaled"]
    assert index.producer("relu") is relu  # not yet re-indexed
    index.refresh()
    assert index.producer("relu") is None and index.reader_count("scaled") == 3
    index.refresh([mul, second_add])
    assert index.nodes == [mul, second_add] and index.producer("sum") is None


def test_fresh_names_added_constants_and_writing_back() -> None:
    model = small_model()
    graph = model.graph
    index = GraphIndex(graph, graph.node, tag="t")
    assert index.fresh("relu") == "relu_t1"
    name = index.add_constant("relu", numpy.ones(3, numpy.float32))
    assert name == "relu_t2" and index.constant(name) is not None
    node = onnx.helper.make_node("Mul", ["sum", name], ["y"])
    index.write_back([*graph.node[:3], node])
    assert [n.op_type for n in graph.node] == ["Mul", "Relu", "Add", "Mul"]
    # The added constant joins the graph; those nothing reads any more leave it.
    assert [t.name for t in graph.initializer] == ["scale", "relu_t2"]
    onnx.checker.check_model(model)


def test_fresh_names_skip_the_graphs_own() -> None:
    model = small_model()
    model.graph.node[1].output[0] = "relu_t1"
    model.graph.node[2].input[:] = ["relu_t1", "relu_t1"]
    graph = model.graph
    assert GraphIndex(graph, graph.node, tag="t").fresh("relu") == "relu_t2"


def test_static_shapes_or_none() -> None:
    model = small_model()
    shapes = static_shapes(model)
    assert shapes is not None and shapes["relu"] == (2, 3) and shapes["y"] == (2, 3)
    assert not has_subgraphs(model.graph)
    branch = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["z"])],
                                    "branch", [], [onnx.helper.make_tensor_value_info(
                                        "z", onnx.TensorProto.FLOAT, [2, 3])])
    model.graph.node.append(onnx.helper.make_node(
        "If", ["flag"], ["w"], then_branch=branch, else_branch=branch))
    assert has_subgraphs(model.graph) and static_shapes(model) is None


def test_static_shapes_are_none_when_inference_fails() -> None:
    model = small_model()
    model.graph.node[0].input[1] = "bias"  # x [2, 3] times a [5, 7]: no broadcast
    model.graph.initializer[1].CopyFrom(onnx.numpy_helper.from_array(
        numpy.zeros((5, 7), numpy.float32), "bias"))
    model.graph.input[1].CopyFrom(onnx.helper.make_tensor_value_info(
        "bias", onnx.TensorProto.FLOAT, [5, 7]))
    assert static_shapes(model) is None


def test_until_fixed_point_counts_the_rewrites() -> None:
    left = [3]

    def step() -> bool:
        if not left[0]:
            return False
        left[0] -= 1
        return True

    assert until_fixed_point(step, 10) == 3
    assert until_fixed_point(step, 0) == 0  # nothing left: one look, no rewrite
    left[0] = 4
    assert until_fixed_point(step, 4) == 4  # exactly the bound: done, not a bug


def test_a_rewrite_that_outruns_its_bound_is_a_bug() -> None:
    calls = []

    def forever() -> bool:
        calls.append(1)
        return True

    with pytest.raises(InternalError, match="did not reach a fixed point in 5 steps"):
        until_fixed_point(forever, 5)
    assert len(calls) == 6  # the bound, and the one more that proves it wrong
