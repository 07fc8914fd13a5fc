"""Quantized versions of the zoo, lowered to XNNPACK by ExecuTorch, for comparing runtimes.

Not a test module. Three PT2E schemes with ExecuTorch's XNNPACKQuantizer
(static per-channel weights, static per-tensor weights, dynamic activations
with per-channel weights) and torchao's int8-dynamic-activation / int4-weight
scheme (blockwise and per-channel 4-bit weights) on linear layers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests.pattern_traces import trace_patterns_once
from tests.runtime.delegates.xnnpack.zoo import ZOO

PT2E_SCHEMES = {"static_per_channel": (True, False), "static_per_tensor": (False, False),
                "dynamic_per_channel": (True, True)}
PT2E_MODELS = ["mlp", "conv_bn_relu_maxpool", "mobilenet_block", "conv_transpose", "pooling",
               "tensor_ops", "attention", "tiny_vit"]


def pt2e_pte(name: str, scheme: str) -> bytes:
    """Zoo model `name` quantized with `scheme` and lowered to XNNPACK."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    per_channel, dynamic = PT2E_SCHEMES[scheme]
    model = ZOO[name]
    inputs = model.inputs()
    captured = torch.export.export(model.module(), inputs).module()
    trace_patterns_once()
    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=per_channel, is_dynamic=dynamic))
    prepared = prepare_pt2e(captured, quantizer)
    prepared(*inputs)  # calibration
    exported = torch.export.export(convert_pt2e(prepared), inputs)
    edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
    return bytes(edge.to_executorch().buffer)


class Linears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 96), nn.Linear(96, 32, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def int4_module(granularity: str) -> nn.Module:
    torch.manual_seed(7)
    return Linears().eval()


def int4_inputs() -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(8)
    return (torch.randn(5, 64, generator=generator),)


def int4_pte(granularity: str) -> tuple[bytes, nn.Module]:
    """torchao's 8-bit dynamic activations, 4-bit weights (per block of 32, or per channel)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    module = int4_module(granularity)
    chosen: Any = PerGroup(32) if granularity == "group" else PerAxis(0)
    quantize_(module, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4,
                                                            weight_granularity=chosen))
    exported = torch.export.export(module, int4_inputs())
    edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
    return bytes(edge.to_executorch().buffer), module
