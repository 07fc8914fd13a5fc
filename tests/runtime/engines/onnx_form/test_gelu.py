"""A decomposed tanh-GELU in the ONNX form is one Gelu node
(exirc.runtime.engines.onnx_form.rewrites.gelu): GPT-2 style MLPs compiled for XNNPACK, with
GPT-2's gelu_new, with the formula written in other orders and in its sigmoid
form (torch's own tanh GELU as exirc lowers it), run on
onnxruntime with eager's answers (the zoo's tolerances) and one Gelu node per
activation. Near misses (a constant off in its last digits, an intermediate
read elsewhere) stay node by node and still give eager's answers. A hand-built
ONNX model covers the forms torch does not emit (Pow(x, 3), 0.5 on the
product) and a constant that a caller may override."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from exirc.runtime.engines.onnx_form.rewrites.gelu import fuse_tanh_gelus
from tests.runtime.engines.onnx_form.test_fusions import (  # noqa: F401 (onnx_ops: a fixture)
    compiled_against_eager,
    onnx_ops,
)

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

RTOL, ATOL = 1e-4, 1e-5  # the conformance zoo's (tests/models/zoo.py)
SCALE = math.sqrt(2.0 / math.pi)


def gelu_new(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GPT-2's activation, as transformers writes it; and the tanh's input."""
    inner = SCALE * (x + 0.044715 * torch.pow(x, 3.0))
    return 0.5 * x * (1.0 + torch.tanh(inner)), inner


def gelu_reordered(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same function, its products and sums in other orders."""
    inner = (x * x * x * 0.044715 + x) * SCALE
    return (x * (torch.tanh(inner) + 1.0)) * 0.5, inner


def gelu_off_constant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Not GELU: 0.04472 for 0.044715."""
    inner = SCALE * (x + 0.04472 * x * x * x)
    return 0.5 * x * (1.0 + torch.tanh(inner)), inner


def torch_tanh_gelu(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's own, which exirc lowers to x * sigmoid(x * (x * x * c + 2k))."""
    return nn.functional.gelu(x, approximate="tanh"), x


def gelu_sigmoid_of_scaled_sum(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sigmoid form with the scale on the sum: x * sigmoid(2k (x + 0.044715 x^3))."""
    inner = (x + 0.044715 * x * x * x) * (2 * SCALE)
    return x * torch.sigmoid(inner), inner


def quick_gelu(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Not this GELU: CLIP's x * sigmoid(1.702 x)."""
    return x * torch.sigmoid(1.702 * x), x


class Mlp(nn.Module):
    """GPT-2's MLP (Linear, activation, Linear); `leak` also returns the tanh's input."""

    def __init__(self, activation: str, leak: bool = False) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 16)
        self.activation, self.leak = activation, leak

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        activation = {"gelu_new": gelu_new, "reordered": gelu_reordered,
                      "off_constant": gelu_off_constant, "torch_tanh": torch_tanh_gelu,
                      "sigmoid_scaled_sum": gelu_sigmoid_of_scaled_sum,
                      "quick_gelu": quick_gelu}[self.activation]
        a, inner = activation(self.up(x))
        y = self.down(a)
        return (y, inner) if self.leak else (y,)


@pytest.mark.parametrize(("activation", "leak", "gelus", "gate"), [
    ("gelu_new", False, 1, "Tanh"), ("reordered", False, 1, "Tanh"),
    ("off_constant", False, 0, "Tanh"), ("gelu_new", True, 0, "Tanh"),
    ("torch_tanh", False, 1, "Sigmoid"), ("sigmoid_scaled_sum", False, 1, "Sigmoid"),
    ("sigmoid_scaled_sum", True, 0, "Sigmoid"), ("quick_gelu", False, 0, "Sigmoid")],
    ids=["gelu_new", "reordered", "off_constant", "tanh_input_read_elsewhere",
         "F.gelu_tanh", "sigmoid_of_scaled_sum", "sigmoid_input_read_elsewhere", "quick_gelu"])
def test_tanh_gelu_in_either_form_is_one_node_with_eager_answers(
        activation: str, leak: bool, gelus: int, gate: str,
        onnx_ops: list[list[str]], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    torch.manual_seed(0)
    model = Mlp(activation, leak).eval()
    inputs = [torch.randn(1, 8, 16) * 2]
    compiled_against_eager(model, inputs, monkeypatch, RTOL, ATOL)
    ops = [op for delegate in onnx_ops for op in delegate]
    assert ops.count("Gelu") == gelus, ops
    assert (gate in ops) == (gelus == 0), ops  # the tanh or sigmoid node left unfused


def _hand_built(cube: str, half_on: str, scale_is_input: bool = False) -> object:
    """y = GELU(x) for x [2, 5] in ONNX, x^3 as `cube` ("pow" or "muls") and the 0.5 on
    `half_on` ("x" or "product"); `scale_is_input`: sqrt(2/pi) is an overridable input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def constant(name: str, value: float) -> onnx.TensorProto:
        return numpy_helper.from_array(torch.tensor([[value]]).numpy(), name)

    nodes = [helper.make_node("Pow", ["x", "three"], ["x3"]) if cube == "pow" else
             helper.make_node("Mul", ["x", "x"], ["x2"]),
             *([] if cube == "pow" else [helper.make_node("Mul", ["x", "x2"], ["x3"])]),
             helper.make_node("Mul", ["cubic", "x3"], ["b"]),
             helper.make_node("Add", ["b", "x"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["u"]),
             helper.make_node("Tanh", ["u"], ["t"]),
             helper.make_node("Add", ["one", "t"], ["w"])]
    if half_on == "x":
        nodes += [helper.make_node("Mul", ["x", "half"], ["a"]),
                  helper.make_node("Mul", ["w", "a"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["w", "x"], ["p"]),
                  helper.make_node("Mul", ["half", "p"], ["y"])]
    constants = [constant("three", 3.0), constant("cubic", 0.044715), constant("scale", SCALE),
                 constant("one", 1.0), constant("half", 0.5)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])]
    if scale_is_input:
        inputs.append(helper.make_tensor_value_info("scale", TensorProto.FLOAT, [1, 1]))
    graph = helper.make_graph(nodes, "gelu", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
                              constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize(("cube", "half_on", "scale_is_input", "fused"), [
    ("pow", "x", False, 1), ("muls", "product", False, 1),
    ("pow", "product", True, 0)],
    ids=["pow_half_on_x", "muls_half_on_product", "scale_overridable"])
def test_hand_built_forms(cube: str, half_on: str, scale_is_input: bool, fused: int) -> None:
    import onnxruntime

    model = _hand_built(cube, half_on, scale_is_input)
    assert fuse_tanh_gelus(model) == fused  # type: ignore[arg-type]
    ops = [node.op_type for node in model.graph.node]  # type: ignore[attr-defined]
    assert ops == ["Gelu"] if fused else "Tanh" in ops, ops
    x = torch.linspace(-6, 6, 10).reshape(2, 5)
    feeds = {"x": x.numpy()}
    if scale_is_input:
        feeds["scale"] = torch.tensor([[SCALE]]).numpy()
    session = onnxruntime.InferenceSession(model.SerializeToString(),  # type: ignore[attr-defined]
                                           providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, feeds)[0])
    torch.testing.assert_close(got, nn.functional.gelu(x, approximate="tanh"),
                               rtol=RTOL, atol=ATOL)
