"""Boolean reductions in a fused chain in fewer nodes
(exirc.runtime.engines.onnx_form.rewrites.softmax_guard):
torch's safe-softmax guard as the chain translates it (Equal, Not, ReduceMax on
the bools, [Not,] Where) becomes Equal, ReduceMin, Where, and gives bit for
bit the results of the guard reduced over the bools widened to int32 or float
(as `any` is defined) on onnxruntime for rows that are all -inf, -inf with NaN
anywhere, NaN only, +inf, mixed and normal. Casts are left as they are. A ViT-style
attention compiled for XNNPACK runs as one fused chain with the short guard
and eager's answers."""

from __future__ import annotations

import itertools

import numpy
import pytest
import torch
from torch import nn

from exirc.compiler import CompileOptions, compile_module
from exirc.runtime import load
from exirc.runtime.engines.onnx_form.rewrites.softmax_guard import simplify_bool_reductions

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

RTOL, ATOL = 1e-4, 1e-5  # the conformance zoo's (tests/models/zoo.py)
NAN, INF = float("nan"), float("inf")


def guard_model(width: int, negated: bool, widen_to: int | None = onnx.TensorProto.INT32,
                cast_float: bool = False, widened_is_output: bool = False) -> object:
    """softmax(x) over rows of `width`, rows that are all -inf set to 0. `widen_to`:
    `any` reduces the bools cast to that type and back (None: the bools
    themselves, as the fused chain translates it); `negated`: Where(Not(any), 0,
    s) as torch's _safe_softmax has it, else Where(any, s, 0); `cast_float`: the
    reduction reads x itself cast to bool (not a guard); `widened_is_output`: the
    widened mask is also an output."""
    from onnx import TensorProto, helper, numpy_helper

    shape = [2, 3, width]
    source = "x" if cast_float else "not_infinite"
    nodes = [helper.make_node("Equal", ["x", "minus_inf"], ["infinite"]),
             helper.make_node("Not", ["infinite"], ["not_infinite"])]
    if widen_to is None:
        nodes.append(helper.make_node("ReduceMax", [source, "axes"], ["any"], keepdims=1))
    else:
        nodes += [helper.make_node("Cast", [source], ["widened"], to=widen_to),
                  helper.make_node("ReduceMax", ["widened", "axes"], ["reduced"], keepdims=1),
                  helper.make_node("Cast", ["reduced"], ["any"], to=TensorProto.BOOL)]
    nodes.append(helper.make_node("Softmax", ["x"], ["s"], axis=-1))
    if negated:
        nodes += [helper.make_node("Not", ["any"], ["none"]),
                  helper.make_node("Where", ["none", "zeros", "s"], ["y"])]
    else:
        nodes.append(helper.make_node("Where", ["any", "s", "zeros"], ["y"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)]
    if cast_float:
        outputs.append(helper.make_tensor_value_info("not_infinite", TensorProto.BOOL, shape))
    if widened_is_output:
        outputs.append(helper.make_tensor_value_info("widened", widen_to, shape))
    constants = [numpy_helper.from_array(numpy.zeros(shape, numpy.float32), "zeros"),
                 numpy_helper.from_array(numpy.asarray(-INF, numpy.float32), "minus_inf"),
                 numpy_helper.from_array(numpy.asarray([-1], numpy.int64), "axes")]
    graph = helper.make_graph(nodes, "guard",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              outputs, constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    return model


def adversarial_rows(width: int) -> numpy.ndarray:
    """[2, 3, width]: all -inf; -inf with one NaN (each position in turn across
    calls' rows); NaN only; +inf among normals; a mix of everything; normals."""
    rng = numpy.random.default_rng(width)
    mix = numpy.asarray([NAN, INF, -INF, 0.0, -0.0, 1.0, -2.5, 3e38, -3e38], numpy.float32)
    rows = [numpy.full(width, -INF), numpy.full(width, NAN),
            numpy.where(numpy.arange(width) == width // 2, INF, rng.standard_normal(width)),
            rng.choice(mix, width), rng.standard_normal(width)]
    for position in range(width):
        row = numpy.full(width, -INF)
        row[position] = NAN
        rows.append(row)
    rows += [rng.choice(mix[:3], width) for _ in range(12)]
    while len(rows) % 6:
        rows.append(numpy.full(width, -INF))
    return numpy.asarray(rows, numpy.float32).reshape(-1, 2, 3, width)


def run(model: object, x: numpy.ndarray) -> numpy.ndarray:
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(),  # type: ignore[attr-defined]
                                           options, providers=["CPUExecutionProvider"])
    return numpy.stack([session.run(["y"], {"x": batch})[0] for batch in x])


def same_bits(a: numpy.ndarray, b: numpy.ndarray) -> bool:
    nan = numpy.isnan(a)
    return bool((nan == numpy.isnan(b)).all() and
                (a[~nan].view(numpy.int32) == b[~nan].view(numpy.int32)).all())


@pytest.mark.parametrize(("width", "negated", "widen_to"), list(itertools.product(
    [1, 4, 17, 33], [True, False], [onnx.TensorProto.INT32, onnx.TensorProto.FLOAT])))
def test_short_guard_is_bit_for_bit_the_same(width: int, negated: bool, widen_to: int) -> None:
    original = guard_model(width, negated, widen_to)
    short = guard_model(width, negated, None)
    assert simplify_bool_reductions(short)  # type: ignore[arg-type]
    ops = [node.op_type for node in short.graph.node]  # type: ignore[attr-defined]
    assert sorted(ops) == ["Equal", "ReduceMin", "Softmax", "Where"], ops
    x = adversarial_rows(width)
    expected = run(original, x)
    assert (expected.reshape(-1, width)[0] == 0).all()  # the first row: all -inf
    assert same_bits(run(short, x), expected)


@pytest.mark.parametrize("variant", ["cast_float", "widened_is_output"])
def test_near_misses_stay(variant: str) -> None:
    model = guard_model(5, True, **{variant: True})
    before = [node.op_type for node in model.graph.node]  # type: ignore[attr-defined]
    simplify_bool_reductions(model)  # type: ignore[arg-type]
    ops = [node.op_type for node in model.graph.node]  # type: ignore[attr-defined]
    assert (ops.count("Cast"), ops.count("ReduceMax")) == (2, 1), ops
    assert len(ops) == len(before) - 1, ops  # only Where(Not(any), 0, s) is Where(any, s, 0)
    x = adversarial_rows(5)
    assert same_bits(run(model, x), run(guard_model(5, True, **{variant: True}), x))


class Attention(nn.Module):
    """A ViT-style attention block without a mask (its softmax is torch's safe one)."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.qkv, self.out, self.heads = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(x).reshape(batch, tokens, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attended = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(attended.transpose(1, 2).reshape(batch, tokens, dim))


def test_attention_runs_fused_with_the_short_guard() -> None:
    torch.manual_seed(0)
    model = Attention().eval()
    inputs = [torch.randn(1, 5, 16)]
    data = compile_module(model, inputs, options=CompileOptions(target="xnnpack")).data
    method = load(data).method("forward")
    fused = method.accelerated
    assert fused is not None
    ops = [node.op_type for node in onnx.load_from_string(fused.form.model).graph.node]
    assert (ops.count("Equal"), ops.count("ReduceMin"), ops.count("Where")) == (1, 1, 1), ops
    assert not {"Not", "Cast", "ReduceMax"} & set(ops), ops
    with torch.no_grad():
        expected = model(*inputs)
    torch.testing.assert_close(method.run(inputs)[0], expected, rtol=RTOL, atol=ATOL)
