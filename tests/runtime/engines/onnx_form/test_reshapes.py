"""Fewer Reshapes in the ONNX form (exirc.runtime.engines.onnx_form.rewrites.reshapes): on
hand-built ONNX graphs each rule removes the Reshapes it should and the model
gives onnxruntime's original answers bit for bit; a value read elsewhere, a
graph output, a constant that would broadcast, unknown shapes or a layer norm
whose groups do not line up leave the Reshapes where they are. End to end, a
small transformer block compiled for XNNPACK runs with fewer Reshapes and the
same answers (bit for bit against the unsimplified model, within the verify
tolerances against eager)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy
import pytest
import torch
from torch import nn

from exirc.compiler import CompileOptions, compile_module
from exirc.errors import UnsupportedOperatorError
from exirc.runtime.engines.onnx_form import xnnpack_graph as onnx_graph
from tests.runtime.engines.onnx_form.test_fusions import (  # noqa: F401 (onnx_ops: a fixture)
    assert_close,
    on_both_engines,
    onnx_ops,
)

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
helper = onnx.helper
from exirc.runtime.engines.onnx_form.rewrites.reshapes import simplify_reshapes  # noqa: E402

FLOAT = onnx.TensorProto.FLOAT


def reshape(source: str, shape: list[int], target: str) -> Any:
    """A Reshape node and the int64 initializer of its (literal) shape."""
    return (helper.make_node("Reshape", [source, f"{target}_shape"], [target]),
            onnx.numpy_helper.from_array(numpy.asarray(shape, dtype=numpy.int64),
                                         f"{target}_shape"))


def constant(name: str, shape: tuple[int, ...]) -> Any:
    values = numpy.random.default_rng(len(name)).normal(size=shape).astype(numpy.float32)
    return onnx.numpy_helper.from_array(values, name)


@dataclasses.dataclass(frozen=True)
class Case:
    """A hand-built graph (inputs and outputs as name -> dims) and the Reshapes left."""

    name: str
    inputs: dict[str, list[Any]]
    outputs: dict[str, list[int]]
    parts: Callable[[], list[Any]]  # nodes, and initializers (as `reshape`'s pairs or alone)
    reshapes_before: int
    reshapes_after: int


def _model(case: Case) -> Any:
    nodes, initializers = [], []
    for part in case.parts():
        for item in part if isinstance(part, tuple) else (part,):
            (nodes if isinstance(item, onnx.NodeProto) else initializers).append(item)
    graph = helper.make_graph(
        nodes, case.name,
        [helper.make_tensor_value_info(n, FLOAT, dims) for n, dims in case.inputs.items()],
        [helper.make_tensor_value_info(n, FLOAT, dims) for n, dims in case.outputs.items()],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    return model


def _run(model: Any, feeds: dict[str, numpy.ndarray]) -> list[numpy.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def _node(op: str, inputs: list[str], output: str, **attributes: Any) -> Any:
    return helper.make_node(op, inputs, [output], **attributes)


def _norm(source: str, output: str, scale_dims: tuple[int, ...], axis: int,
          bias: bool = True) -> list[Any]:
    inputs = [source, f"{output}_scale"] + ([f"{output}_bias"] if bias else [])
    return [_node("LayerNormalization", inputs, output, axis=axis, epsilon=1e-5),
            *(constant(name, scale_dims) for name in inputs[1:])]


X = {"x": [1, 17, 32]}
PROBS = {"p": [2, 2, 8, 8], "v": [2, 8, 2, 16]}  # attention's scores, values by token
CASES = [
    # Rule 1: a Reshape of a Reshape; shapes written with 0 and -1 are read as inferred.
    Case("merged", {"x": [2, 3, 4]}, {"y": [24]},
         lambda: [reshape("x", [0, -1], "a"), reshape("a", [-1], "b"), _node("Relu", ["b"], "y")],
         2, 1),
    Case("middle_read_elsewhere", {"x": [2, 3, 4]}, {"y": [24], "z": [2, 12]},
         lambda: [reshape("x", [2, 12], "a"), reshape("a", [24], "y"), _node("Abs", ["a"], "z")],
         2, 2),
    Case("middle_is_an_output", {"x": [2, 3, 4]}, {"y": [24], "a": [6, 4]},
         lambda: [reshape("x", [6, 4], "a"), reshape("a", [24], "y")], 2, 2),
    # Rule 2: a Reshape to its input's own shape.
    Case("to_its_own_shape", {"x": [2, 3]}, {"y": [2, 3]},
         lambda: [reshape("x", [2, 3], "a"), _node("Relu", ["a"], "y")], 1, 0),
    Case("own_shape_but_an_output", {"x": [2, 3]}, {"y": [2, 3]},
         lambda: [_node("Relu", ["x"], "a"), reshape("a", [-1, 3], "y")], 1, 1),
    Case("unknown_shapes", {"x": ["n", 4]}, {"y": ["n", 4]},
         lambda: [reshape("x", [-1, 2, 2], "a"), reshape("a", [-1, 4], "b"),
                  _node("Relu", ["b"], "y")], 2, 2),
    # Rule 3: a layer norm on the Reshape's input.
    Case("norm", X, {"y": [1, 17, 32]},
         lambda: [reshape("x", [17, 32, 1, 1], "a"), *_norm("a", "n", (32, 1, 1), 1),
                  reshape("n", [1, 17, 32], "b"), _node("Relu", ["b"], "y")], 2, 0),
    Case("norm_without_bias_to_another_shape", X, {"y": [17, 32]},
         lambda: [reshape("x", [17, 32, 1, 1], "a"),
                  *_norm("a", "n", (32, 1, 1), 1, bias=False), reshape("n", [17, 32], "y")],
         2, 1),
    Case("norm_over_two_dims", {"x": [2, 5, 4, 8]}, {"y": [2, 5, 4, 8]},
         lambda: [reshape("x", [10, 32], "a"), *_norm("a", "n", (32,), -1),
                  reshape("n", [2, 5, 4, 8], "y")], 2, 1),
    # A residual sum read again (pre-norm, as GPT-2) is no SkipLayerNormalization for
    # onnxruntime; one read by the norm alone (post-norm, as BERT) would be.
    Case("norm_of_a_sum_read_again", {"x": [1, 17, 32], "r": [1, 17, 32]},
         {"z": [1, 17, 32]},
         lambda: [_node("Add", ["x", "r"], "s"), reshape("s", [17, 32, 1, 1], "a"),
                  *_norm("a", "n", (32, 1, 1), 1), reshape("n", [1, 17, 32], "y"),
                  _node("Add", ["s", "y"], "z")], 2, 0),
    Case("norm_of_a_sum_read_once", {"x": [1, 17, 32], "r": [1, 17, 32]}, {"y": [1, 17, 32]},
         lambda: [_node("Add", ["x", "r"], "s"), reshape("s", [17, 32, 1, 1], "a"),
                  *_norm("a", "n", (32, 1, 1), 1), reshape("n", [1, 17, 32], "y")], 2, 2),
    Case("norm_groups_do_not_line_up", {"x": [2, 3, 4]}, {"y": [2, 3, 4]},
         lambda: [reshape("x", [3, 8, 1], "a"), *_norm("a", "n", (8, 1), 1),
                  reshape("n", [2, 3, 4], "y")], 2, 2),
    Case("norm_input_read_elsewhere", X, {"y": [1, 17, 32], "z": [17, 32, 1, 1]},
         lambda: [reshape("x", [17, 32, 1, 1], "a"), *_norm("a", "n", (32, 1, 1), 1),
                  reshape("n", [1, 17, 32], "y"), _node("Abs", ["a"], "z")], 2, 2),
    Case("norm_scale_broadcasts", X, {"y": [1, 17, 32]},
         lambda: [reshape("x", [17, 32, 1, 1], "a"), *_norm("a", "n", (1, 1, 1), 1),
                  reshape("n", [1, 17, 32], "y")], 2, 2),
    # Rule 4: elementwise nodes between two Reshapes.
    Case("chain", {"x": [1, 17, 1, 2, 16]}, {"y": [17, 2, 16]},
         lambda: [reshape("x", [1, 17, 2, 16], "a"), _node("Mul", ["a", "c"], "b"),
                  constant("c", (1, 1, 1, 1)), _node("Tanh", ["b"], "d"),
                  _node("Clip", ["d", "lo", "hi"], "e"), constant("lo", ()), constant("hi", ()),
                  _node("Sub", ["k", "e"], "f"), constant("k", (1,)),
                  reshape("f", [17, 2, 16], "y")], 2, 1),
    Case("chain_to_the_input_shape", {"x": [4, 6]}, {"y": [4, 6]},
         lambda: [reshape("x", [24], "a"), _node("Gelu", ["a"], "b"),
                  reshape("b", [4, 6], "y")], 2, 0),
    # onnxruntime folds a scale next to a MatMul (through a Transpose) into its alpha,
    # which rounds differently: the Reshape that moves keeps the two apart.
    Case("scale_moves_away_from_a_matmul", {"x": [1, 17, 1, 2, 16], "k": [2, 16, 8]},
         {"y": [2, 17, 8]},
         lambda: [reshape("x", [1, 17, 2, 16], "a"), _node("Mul", ["a", "c"], "b"),
                  constant("c", (1, 1, 1, 1)), reshape("b", [17, 2, 16], "d"),
                  _node("Transpose", ["d"], "e", perm=[1, 0, 2]),
                  _node("MatMul", ["e", "k"], "y")], 2, 1),
    Case("scale_between_matmuls", {"x": [17, 32]}, {"y": [2, 17, 8]},
         lambda: [_node("MatMul", ["x", "v"], "p"), constant("v", (32, 32)),
                  reshape("p", [1, 17, 2, 16], "a"), _node("Mul", ["a", "c"], "b"),
                  constant("c", (1, 1, 1, 1)), reshape("b", [17, 2, 16], "d"),
                  _node("Transpose", ["d"], "e", perm=[1, 0, 2]),
                  _node("MatMul", ["e", "w"], "y"), constant("w", (16, 8))], 2, 2),
    Case("bias_kept_from_its_gelu", {"x": [4, 32]}, {"y": [4, 32]},
         lambda: [_node("Add", ["x", "c"], "a"), constant("c", (32,)),
                  reshape("a", [4, 32], "b"), _node("Gelu", ["b"], "y")], 1, 1),
    Case("constant_would_broadcast", {"x": [1, 17, 1, 2, 16]}, {"y": [17, 2, 16]},
         lambda: [reshape("x", [1, 17, 2, 16], "a"), _node("Mul", ["a", "c"], "b"),
                  constant("c", (1, 1, 1, 16)), reshape("b", [17, 2, 16], "y")], 2, 2),
    Case("chain_value_read_elsewhere", {"x": [4, 6]}, {"y": [4, 6], "z": [24]},
         lambda: [reshape("x", [24], "a"), _node("Relu", ["a"], "b"),
                  _node("Exp", ["b"], "z"), reshape("b", [4, 6], "y")], 2, 2),
    Case("two_computed_operands", {"x": [4, 6]}, {"y": [4, 6]},
         lambda: [reshape("x", [24], "a"), _node("Mul", ["a", "a"], "b"),
                  reshape("b", [4, 6], "y")], 2, 2),
    Case("shape_sensitive_op", {"x": [4, 6]}, {"y": [4, 6]},
         lambda: [reshape("x", [6, 4], "a"), _node("Softmax", ["a"], "b", axis=-1),
                  reshape("b", [4, 6], "y")], 2, 2),
    # Rule 5: a MatMul between Reshapes that flatten and restore its batch dims.
    Case("matmul_on_its_batch_dims", PROBS, {"y": [2, 2, 8, 16]},
         lambda: [_node("Softmax", ["p"], "s", axis=-1), reshape("s", [4, 8, 8], "a"),
                  _node("Transpose", ["v"], "t", perm=[0, 2, 1, 3]),
                  reshape("t", [4, 8, 16], "b"), _node("MatMul", ["a", "b"], "m"),
                  reshape("m", [2, 2, 8, 16], "y")], 3, 0),
    Case("matmul_operand_read_elsewhere", PROBS, {"y": [2, 2, 8, 16], "z": [4, 8, 8]},
         lambda: [reshape("p", [4, 8, 8], "a"), _node("Abs", ["a"], "z"),
                  _node("Transpose", ["v"], "t", perm=[0, 2, 1, 3]),
                  reshape("t", [4, 8, 16], "b"), _node("MatMul", ["a", "b"], "m"),
                  reshape("m", [2, 2, 8, 16], "y")], 3, 3),
    Case("matmul_batch_dims_regrouped", PROBS, {"y": [4, 1, 8, 16]},
         lambda: [reshape("p", [4, 8, 8], "a"),
                  _node("Transpose", ["v"], "t", perm=[0, 2, 1, 3]),
                  reshape("t", [4, 8, 16], "b"), _node("MatMul", ["a", "b"], "m"),
                  reshape("m", [4, 1, 8, 16], "y")], 3, 3),
    # A scale after the product would meet the MatMul and become its alpha.
    Case("matmul_kept_from_its_scale", {"q": [2, 2, 8, 16], "k": [2, 2, 16, 8]},
         {"y": [2, 2, 8, 8]},
         lambda: [reshape("q", [4, 8, 16], "a"), reshape("k", [4, 16, 8], "b"),
                  _node("MatMul", ["a", "b"], "m"), reshape("m", [2, 2, 8, 8], "r"),
                  _node("Mul", ["r", "c"], "y"), constant("c", (1, 1, 1, 1))], 3, 3),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hand_built_reshapes(case: Case) -> None:
    model = _model(case)
    simplified = onnx.ModelProto()
    simplified.CopyFrom(model)
    simplify_reshapes(simplified)
    onnx.checker.check_model(simplified, full_check=True)
    ops = [node.op_type for node in model.graph.node]
    left = [node.op_type for node in simplified.graph.node]
    assert (ops.count("Reshape"), left.count("Reshape")) == (
        case.reshapes_before, case.reshapes_after), left
    assert simplified.graph.input == model.graph.input
    assert simplified.graph.output == model.graph.output
    rng = numpy.random.default_rng(0)
    feeds = {name: rng.normal(size=[3 if isinstance(d, str) else d for d in dims])
             .astype(numpy.float32) for name, dims in case.inputs.items()}
    for ours, theirs in zip(_run(simplified, feeds), _run(model, feeds), strict=True):
        assert ours.shape == theirs.shape
        assert numpy.array_equal(ours, theirs)


# -- end to end: a transformer block compiled for XNNPACK ------------------------------


class Block(nn.Module):
    """Pre-norm attention (heads split by reshapes) and a GELU MLP."""

    def __init__(self, width: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.project = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(),
                                 nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(batch, tokens, 3, self.heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attention = ((q * 0.25) @ k.transpose(-2, -1)).softmax(-1)
        mixed = (attention @ v).transpose(1, 2).reshape(batch, tokens, width)
        x = x + self.project(mixed)
        return x + self.mlp(self.norm2(x))


def test_a_transformer_block_runs_with_fewer_reshapes(
        onnx_ops: list[list[str]], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(1, 9, 32)
    data = compile_module(model, (x,), options=CompileOptions(target="xnnpack")).data
    simplified = on_both_engines(data, [x], monkeypatch)
    with torch.no_grad():
        assert_close(simplified, [model(x)], "onnxruntime vs eager")
    monkeypatch.setattr(onnx_graph, "DELEGATE_RULES", tuple(
        rule for rule in onnx_graph.DELEGATE_RULES if rule.name != "reshapes"))
    as_emitted = on_both_engines(data, [x], monkeypatch)
    for ours, theirs in zip(simplified, as_emitted, strict=True):
        assert torch.equal(ours, theirs)
    fewer, emitted = ([op for delegate in onnx_ops[half] for op in delegate].count("Reshape")
                      for half in (slice(0, len(onnx_ops) // 2),
                                   slice(len(onnx_ops) // 2, None)))
    assert fewer < emitted, onnx_ops
    assert "LayerNormalization" in onnx_ops[0]


def test_shapes_that_contradict_leave_the_model_as_it_is() -> None:
    case = Case("contradiction", {"x": [2, 3]}, {"y": [7]},
                lambda: [reshape("x", [6], "a"), reshape("a", [6], "y")], 2, 2)
    model = _model(case)
    simplified = onnx.ModelProto()
    simplified.CopyFrom(model)
    simplify_reshapes(simplified)
    assert simplified == model


def test_a_rule_that_fails_leaves_the_delegate_to_the_reference_with_its_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A graph no rule foresaw (a hostile file's) must not fail the load with the
    # rule's own exception, nor be swallowed: the delegate runs on the reference
    # with the failure as its recorded reason, or, with onnxruntime asked for by
    # name, the load fails with the engine's typed error naming the rule.
    from exirc.runtime import load
    from exirc.runtime.engines.onnx_form import rules

    def broken(model: Any) -> int:
        raise IndexError("list index out of range")

    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(1, 9, 32)
    data = compile_module(model, (x,), options=CompileOptions(target="xnnpack")).data
    failing = tuple(rules.Rule(r.name, broken, r.what) if r.name == "reshapes" else r
                    for r in rules.DELEGATE_RULES)
    monkeypatch.setattr(rules, "DELEGATE_RULES", failing)
    monkeypatch.setattr(onnx_graph, "DELEGATE_RULES", failing)
    method = load(data).method("forward")
    assert method.delegate_engines[0].startswith("reference (not on onnxruntime: rewrite rule "
                                                 "'reshapes' failed: IndexError")
    with torch.no_grad():
        assert_close(method.run([x]), [model(x)], "reference vs eager")
    with pytest.raises(UnsupportedOperatorError, match="rewrite rule 'reshapes' failed: "
                                                        "IndexError"):
        load(data, engine="onnxruntime")
