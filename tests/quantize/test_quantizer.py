"""exirc's pt2e quantizer: what it quantizes, and what it leaves float."""

from __future__ import annotations

import pytest
import torch

from exirc.errors import ModelError, UsageError
from exirc.quantize import QuantizeConfig, quantize_method

Q = torch.ops.quantized_decomposed


class ConvBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        y = y.mean((2, 3))
        return self.head(self.norm(y) + y)


def _quantized(module: torch.nn.Module, args: tuple[torch.Tensor, ...], mode: str = "int8"
               ) -> torch.fx.GraphModule:
    torch.manual_seed(0)
    exported = torch.export.export(module.eval(), args)
    result = quantize_method(exported, QuantizeConfig(mode), [args], args, None, "forward")
    return result.module


def _targets(module: torch.fx.GraphModule) -> list[object]:
    return [n.target for n in module.graph.nodes if n.op == "call_function"]


def test_conv_relu_pool_stay_quantized_and_norm_stays_float() -> None:
    torch.manual_seed(0)
    module = _quantized(ConvBlock(), (torch.randn(1, 3, 8, 8),))
    nodes = {n.name: n for n in module.graph.nodes}
    targets = _targets(module)
    # Weights: per channel, symmetric.
    assert targets.count(Q.dequantize_per_channel.default) == 2
    # relu is fused: the conv's output is not quantized before it.
    relu = next(n for n in nodes.values() if n.target == torch.ops.aten.relu.default)
    assert relu.args[0].target == torch.ops.aten.conv2d.default
    # max pooling shares its input's quantization: same scale before and after.
    pool = next(n for n in nodes.values() if n.target == torch.ops.aten.max_pool2d.default)
    before = pool.args[0]
    after = next(iter(pool.users))
    assert before.target == Q.dequantize_per_tensor.default
    assert after.target == Q.quantize_per_tensor.default
    assert before.args[1] == after.args[1] and before.args[2] == after.args[2]
    # layer norm runs in float on a dequantized tensor, with float parameters; its
    # output is quantized only because the add after it is.
    norm = next(n for n in nodes.values() if n.target == torch.ops.aten.layer_norm.default)
    assert norm.args[0].target == Q.dequantize_per_tensor.default
    assert norm.args[2].op == "get_attr"


def test_quantized_module_is_close_to_the_float_one() -> None:
    torch.manual_seed(0)
    model, x = ConvBlock().eval(), torch.randn(1, 3, 8, 8)
    quantized = _quantized(model, (x,))
    expected = model(x)
    error = (quantized(x) - expected).abs().max()
    assert 0 < float(error) < 0.1 * float(expected.abs().max())


def test_weight_only_leaves_activations_float() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU())
    module = _quantized(model, (torch.randn(2, 64),), "int4-weight-only")
    targets = _targets(module)
    assert Q.dequantize_per_channel_group.default in targets
    assert Q.quantize_per_tensor.default not in targets


def test_nothing_to_quantize_is_a_model_error() -> None:
    with pytest.raises(ModelError, match="found nothing to quantize"):
        _quantized(torch.nn.ReLU(), (torch.randn(3),))


def test_config_is_checked() -> None:
    with pytest.raises(UsageError, match="unknown quantization mode"):
        QuantizeConfig("int3")
    with pytest.raises(UsageError, match="group size applies to the weight-only"):
        QuantizeConfig("int8", group_size=32)
    with pytest.raises(UsageError, match="even number"):
        QuantizeConfig("int4-weight-only", group_size=7)


def test_calibration_inputs_must_be_npz_and_say_so(tmp_path: object) -> None:
    from pathlib import Path

    from exirc.compiler import CompileOptions, compile_module

    bad = Path(str(tmp_path)) / "inputs.txt"
    bad.write_text("not arrays")
    model = torch.nn.Linear(8, 4)
    with pytest.raises(UsageError, match="calibration inputs are a .npz file"):
        compile_module(model, (torch.randn(2, 8),), options=CompileOptions(
            quantize="int8", calibration_inputs=(str(bad),)))
