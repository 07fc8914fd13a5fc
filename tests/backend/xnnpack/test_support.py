"""XnnpackSupport: what it takes, and the reason it gives for each node it leaves out."""

from __future__ import annotations

import operator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from exirc.backend.xnnpack.serializer import EMITTERS
from exirc.backend.xnnpack.support import ALL_RULES, XnnpackSupport
from tests.backend.xnnpack.harness import backend_program


def decisions(model: torch.nn.Module, *inputs: Any, **export: Any) -> dict[str, Any]:
    """Node name -> None (taken) or (category, reason), for the Backend-dialect graph."""
    program = backend_program(model, inputs, **export)
    support = XnnpackSupport()
    found: dict[str, Any] = {}
    for node in program.graph_module.graph.nodes:
        if node.op == "call_function":
            rejection = support.check(node, program)
            found[node.name] = None if rejection is None else (rejection.category, rejection.reason)
    return found


class Lambda(torch.nn.Module):
    def __init__(self, fn: Any, **params: torch.Tensor) -> None:
        super().__init__()
        self.fn = fn
        for name, value in params.items():
            self.register_parameter(name, torch.nn.Parameter(value))

    def forward(self, *args: Any) -> Any:
        return self.fn(self, *args)


def only(found: dict[str, Any], prefix: str) -> Any:
    matches = [v for k, v in found.items() if k.startswith(prefix)]
    assert len(matches) == 1, found
    return matches[0]


def test_every_operator_it_takes_has_an_emitter() -> None:
    assert set(ALL_RULES) | {operator.getitem} == set(EMITTERS)


def test_a_conv_bn_relu_block_is_taken_whole() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU(), torch.nn.MaxPool2d(2))
    assert set(decisions(model, torch.randn(1, 3, 10, 10)).values()) == {None}


def test_run_time_convolution_weights_are_a_constraint() -> None:
    found = decisions(Lambda(lambda m, x, w: F.conv2d(x, w)),
                      torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3))
    assert only(found, "convolution") == (
        "constraint", "convolution weight computed at run time; XNNPACK packs constant "
                      "filters only")


def test_integer_tensors_are_a_dtype_rejection() -> None:
    found = decisions(Lambda(lambda m, x: x * 3), torch.arange(6))
    assert only(found, "mul") == (
        "dtype", "aten.mul.Tensor computes torch.int64; XNNPACK here runs float32 only")


def test_integer_constants_of_float_ops_are_converted_not_rejected() -> None:
    found = decisions(Lambda(lambda m, x: x + 1), torch.randn(4))
    assert only(found, "add") is None


def test_dynamic_shapes_are_taken_where_xnnpack_resizes_the_operator() -> None:
    batch = torch.export.Dim("batch", min=2, max=16)
    found = decisions(Lambda(lambda m, x: torch.relu(x)[:2, 1:].reshape(-1)), torch.randn(4, 3),
                      dynamic_shapes=(({0: batch},),))
    assert only(found, "relu") is None
    slices = sorted(v for k, v in found.items() if k.startswith("slice") and v is not None)
    assert slices == [("shape", "aten.slice_copy.Tensor slices dynamic dim 0; XNNPACK's static "
                                "slice has fixed bounds (a dynamic dim is taken whole only)")]
    assert sum(k.startswith("slice") for k in found) == 2  # the one along dim 1 is taken


def test_a_reshape_with_two_dynamic_dims_is_a_shape_rejection() -> None:
    rows, cols = torch.export.Dim("rows", min=1, max=8), torch.export.Dim("cols", min=1, max=8)
    found = decisions(Lambda(lambda m, x: x.unsqueeze(0) * 2), torch.randn(4, 3),
                      dynamic_shapes=(({0: rows, 1: cols},),))
    category, reason = only(found, "unsqueeze")
    assert category == "shape"
    assert reason.startswith("aten.unsqueeze_copy.default makes 2 dynamic dims [1, s")
    assert reason.endswith("; XNNPACK's reshape infers one dim at run time")
    assert only(found, "mul") is None


def test_a_dim_that_can_be_0_is_a_shape_rejection() -> None:
    """ExecuTorch's XNNPACK runtime fails a call with an empty input; a Dim's
    range starts at 0 unless given a min."""
    for low, taken in ((0, False), (1, True)):
        seq = torch.export.Dim("seq", min=low, max=8)
        found = decisions(Lambda(lambda m, x: torch.relu(x)), torch.randn(4, 3),
                          dynamic_shapes=(({0: seq},),))
        if taken:
            assert only(found, "relu") is None
            continue
        category, reason = only(found, "relu")
        assert category == "shape"
        assert reason.startswith("input args_0 may be empty: its dim s")
        assert reason.endswith(" can be 0, and XNNPACK takes no empty tensors; give the dim "
                               "min=1 (torch.export.Dim(..., min=1, max=...))")


def test_a_size_used_as_a_number_is_a_shape_rejection() -> None:
    batch = torch.export.Dim("batch", min=2, max=16)
    found = decisions(Lambda(lambda m, x: x * x.shape[0]), torch.randn(4, 3),
                      dynamic_shapes=(({0: batch},),))
    # scalars_to_tensors makes the size a tensor at run time (scalar_tensor): that
    # stays on the interpreter, and the multiply by it runs in XNNPACK
    category, reason = only(found, "scalar_tensor")
    assert category == "shape" and \
        reason.startswith("aten.scalar_tensor.default computes with the size ")
    assert only(found, "mul") is None


def test_a_layer_norm_over_a_dynamic_dim_is_a_shape_rejection() -> None:
    width = torch.export.Dim("width", min=1, max=8)
    found = decisions(Lambda(lambda m, x: F.layer_norm(x, x.shape[-1:])), torch.randn(2, 4),
                      dynamic_shapes=(({1: width},),))
    assert only(found, "native_layer_norm") == (
        "shape", "aten.native_layer_norm.default normalizes over a dynamic dim; taken over "
                 "static dims only")


def test_rank_beyond_six_is_a_shape_rejection() -> None:
    found = decisions(Lambda(lambda m, x: x.exp()), torch.randn([1] * 7))
    assert only(found, "exp") == ("shape", "input args_0 has rank 7; XNNPACK takes at most 6")


def test_operators_without_an_xnnpack_operator() -> None:
    found = decisions(Lambda(lambda m, x: torch.where(x > 0, x, 0.0)), torch.randn(4))
    assert only(found, "where") == (
        "op", "XNNPACK has no operator for aten.where.self (taken only as part of PReLU: "
              "where(x > 0, x, w * x) with w constant per channel)")
    assert only(found, "gt") == (
        "op", "XNNPACK has no operator for aten.gt.Scalar (taken only as part of PReLU: "
              "where(x > 0, x, w * x) with w constant per channel)")


def test_an_attention_guard_is_not_explained_as_prelu() -> None:
    # where(mask, scores, -inf): a select by a mask, with no PReLU about it.
    def guard(m: Any, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.where(mask > 0.5, scores, float("-inf")).softmax(-1)

    found = decisions(Lambda(guard), torch.randn(2, 4), torch.rand(2, 4))
    assert only(found, "where") == ("op", "XNNPACK has no operator for aten.where.self")
    assert only(found, "gt") == ("op", "XNNPACK has no operator for aten.gt.Scalar")


def test_ops_are_named_by_their_own_namespace() -> None:
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines the Q/DQ ops)

    qd = torch.ops.quantized_decomposed

    def dynamic(m: Any, x: torch.Tensor) -> torch.Tensor:
        scale, zero = qd.choose_qparams.tensor(x, -128, 127, 1e-5, torch.int8)
        q = qd.quantize_per_tensor.tensor(x, scale, zero, -128, 127, torch.int8)
        return qd.dequantize_per_tensor.tensor(q, scale, zero, -128, 127, torch.int8)

    found = decisions(Lambda(dynamic), torch.randn(2, 4))
    assert only(found, "choose_qparams") == (
        "op", "XNNPACK has no operator for quantized_decomposed.choose_qparams.tensor")


def test_decomposed_prelu_is_taken_whole() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.PReLU(4))
    found = decisions(model, torch.randn(1, 3, 4, 4))
    assert {name.rstrip("_0123456789") for name in found} == {"convolution", "gt", "mul", "where"}
    assert set(found.values()) == {None}


@pytest.mark.parametrize(("fn", "node", "reason"), [
    (lambda m, x: x[:, ::2], "slice",
     "slice with step 2; XNNPACK's static slice takes step 1 only"),
    (lambda m, x: x ** 5, "pow",
     "pow with exponent 5; taken for exponents 1, 2, 3, 4, -1, 0.5 and -0.5 (XNNPACK's "
     "square, square root and reciprocal square root, and products of them)"),
    (lambda m, x: F.pad(x, (-1, 0)), "constant_pad",
     "negative padding [-1, 0] (cropping); XNNPACK pads only"),
])
def test_argument_constraints(fn: Any, node: str, reason: str) -> None:
    assert only(decisions(Lambda(fn), torch.randn(2, 6)), node) == ("constraint", reason)


@pytest.mark.parametrize(("fn", "node", "reason"), [
    (lambda m, x: F.avg_pool2d(x, 2, ceil_mode=True), "avg_pool2d",
     "avg_pool2d ceil_mode with a partial last window; XNNPACK averages whole windows only"),
    (lambda m, x: F.max_pool2d(x, 1, 2), "max_pool2d",
     "aten.max_pool2d_with_indices.default with a 1x1 window and stride [2, 2]; XNNPACK "
     "pools windows larger than 1x1"),
    (lambda m, x: F.max_pool2d(x, 2, 3), "max_pool2d",
     "aten.max_pool2d_with_indices.default stride [3, 3] larger than its window [2, 2]; "
     "XNNPACK requires stride <= window"),
    (lambda m, x: F.interpolate(x, scale_factor=1.5, mode="nearest"), "upsample_nearest2d",
     "nearest resize [5, 5] -> [7, 7] by a fractional factor; taken for whole factors only"),
    (lambda m, x: F.adaptive_avg_pool2d(x, 2), "_adaptive_avg_pool2d",
     "adaptive average pooling [5, 5] -> [2, 2] with windows of different sizes; taken "
     "when the output divides the input"),
])
def test_image_operator_constraints(fn: Any, node: str, reason: str) -> None:
    assert only(decisions(Lambda(fn), torch.randn(1, 2, 5, 5)), node) == ("constraint", reason)


def test_used_max_pool_indices_are_a_constraint() -> None:
    found = decisions(Lambda(lambda m, x: F.max_pool2d(x, 2, return_indices=True)),
                      torch.randn(1, 2, 4, 4))
    assert found["max_pool2d_with_indices"] == found["getitem"] == (
        "constraint", "getitem_1 uses an output of aten.max_pool2d_with_indices.default "
                      "other than the first; XNNPACK computes only the first")
    assert found["getitem_1"] == (
        "constraint", "output 1 of aten.max_pool2d_with_indices.default is used; XNNPACK "
                      "computes output 0 only")


def test_three_d_convolution_is_a_constraint() -> None:
    found = decisions(torch.nn.Conv3d(2, 2, 1), torch.randn(1, 2, 3, 3, 3))
    assert only(found, "convolution") == (
        "constraint", "3-d convolution; XNNPACK has 2-d ones (1-d go through them)")


def test_what_it_takes_beyond_executorchs_partitioner() -> None:
    # Softmax over any dim, mean over any dims, layer norm, nearest resize by
    # whole factors, select and expand: built from XNNPACK operators.
    model = Lambda(lambda m, x: (torch.softmax(x, 1), x.mean(1), F.layer_norm(x, [5]),
                                 F.interpolate(x, scale_factor=2.0), x.select(1, 0),
                                 x.expand(2, 3, 5, 5), x.unbind(1)[2]))
    assert set(decisions(model, torch.randn(1, 3, 5, 5)).values()) == {None}
