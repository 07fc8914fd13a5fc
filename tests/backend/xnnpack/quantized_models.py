"""Small models quantized with pt2e and ExecuTorch's XNNPACKQuantizer (static, per-channel
weights), for the quantized lowering tests. Not a test module.

Each case records what two other lowerings of the same program leave on the
portable kernels and make of it, for comparison:

  - `before`: exirc's `--target xnnpack` before quantized groups were taken
    (commit c6b8fa3): the float ops delegated one by one, Q/DQ on portable;
  - `executorch`: ExecuTorch 1.5.1's `to_edge_transform_and_lower(...,
    [XnnpackPartitioner()])`, its payloads decoded (a slow test re-measures it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Reference:
    kernel_calls: int   # instructions left on portable kernels
    nodes: int          # XNNPACK nodes in all payloads


@dataclass(frozen=True)
class QuantizedCase:
    make: Callable[[], nn.Module]
    inputs: Callable[[], tuple[Any, ...]]
    before: int          # kernel calls left on portable by exirc before
    executorch: Reference


def _bn(channels: int) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(channels)
    assert bn.running_mean is not None and bn.running_var is not None
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


class MLP(nn.Module):
    """Linear-ReLU (one quantized node) and a ReLU6 quantized on its own."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu6(self.fc2(F.relu(self.fc1(x)))))


class CNN(nn.Module):
    """Conv-BN-ReLU-MaxPool twice, then a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), _bn(8)
        self.c2, self.b2 = nn.Conv2d(8, 16, 3, padding=1), _bn(16)
        self.fc = nn.Linear(16 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = F.max_pool2d(F.relu(self.b2(self.c2(x))), 2)
        return self.fc(x.flatten(1))


class MobileNetBlock(nn.Module):
    """A stem, a depthwise-separable block with a residual add, global pooling, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.b0 = nn.Conv2d(3, 16, 3, stride=2, padding=1), _bn(16)
        self.dw, self.b1 = nn.Conv2d(16, 16, 3, padding=1, groups=16), _bn(16)
        self.pw, self.b2 = nn.Conv2d(16, 16, 1), _bn(16)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu6(self.b0(self.stem(x)))
        y = self.b2(self.pw(F.relu6(self.b1(self.dw(x)))))
        x = F.relu(x + y)
        return self.head(x.mean((2, 3)))


class TransformerBlock(nn.Module):
    """Attention and an MLP of linear layers, with residual adds (no norms)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        attention = torch.softmax(q @ k.transpose(-1, -2) / 8, -1)
        x = x + self.o(attention @ v)
        return x + self.down(F.relu(self.up(x)))


def _inputs(*shape: int) -> Callable[[], tuple[torch.Tensor, ...]]:
    def make() -> tuple[torch.Tensor, ...]:
        return (torch.randn(*shape, generator=torch.Generator().manual_seed(1)),)
    return make


CASES: dict[str, QuantizedCase] = {
    "mlp": QuantizedCase(MLP, _inputs(4, 16), before=13, executorch=Reference(0, 6)),
    "cnn": QuantizedCase(CNN, _inputs(2, 3, 8, 8), before=19, executorch=Reference(0, 10)),
    # ExecuTorch leaves the mean (keepdim=False) on portable.
    "mobilenet_block": QuantizedCase(MobileNetBlock, _inputs(2, 3, 16, 16), before=26,
                                     executorch=Reference(1, 13)),
    # ExecuTorch leaves a dim-order copy and the expands of the batched matmuls.
    "transformer_block": QuantizedCase(TransformerBlock, _inputs(2, 6, 32), before=32,
                                       executorch=Reference(5, 25)),
}


def quantize(model: nn.Module, inputs: tuple[Any, ...]) -> torch.fx.GraphModule:
    """pt2e with XNNPACKQuantizer, static per-channel: export, prepare, calibrate on
    the inputs and a few more, convert; in eval mode the export-aware way."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e import move_exported_model_to_eval
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    captured = torch.export.export(model.eval(), inputs).module()
    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(captured, quantizer)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        prepared(*inputs)
        for _ in range(4):
            prepared(*(torch.randn(t.shape, generator=generator) for t in inputs))
    converted = convert_pt2e(prepared)
    move_exported_model_to_eval(converted)
    return converted


def output_scales(model: torch.fx.GraphModule) -> list[float]:
    """Per output: the scale of the dequantize that makes it (one quantization step)."""
    output = next(n for n in model.graph.nodes if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
    scales = []
    for result in results:
        assert "dequantize_per_tensor" in str(result.target), result
        scales.append(float(result.args[1]))
    return scales
