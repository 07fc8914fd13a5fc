"""Multi-method programs count each weight once in every summary.

A model's methods (prefill and decode, a batch of 4 and of 1) read the same
weights, which the file stores once; the quantization report (layers, weight
tables, float bytes, the ratio) and the delegation summary must say so, and
agree with what one method alone reports. Expected numbers come from the eager
model's own parameters.
"""

from __future__ import annotations

import pytest
import torch

from exirc.backend.delegation.report import unique_weight_bytes
from exirc.compiler import CompileOptions, compile_module


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 64)
        self.fc1 = torch.nn.Linear(64, 128)
        self.fc2 = torch.nn.Linear(128, 32)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(self.embed(tokens))))


def _model() -> tuple[TwoLayers, tuple[torch.Tensor], tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = TwoLayers().eval()
    return model, (torch.randint(0, 32, (1, 1)),), (torch.randint(0, 32, (1, 8)),)


@pytest.mark.parametrize("mode", ["int8", "int8-weight-only"])
def test_two_methods_report_the_weights_of_one(mode: str) -> None:
    model, decode, prefill = _model()
    options = CompileOptions(quantize=mode)
    one = compile_module(model, decode, options=options).quantization
    two = compile_module(model, decode, methods={"prefill": (model, prefill)},
                         options=options).quantization
    assert one is not None and two is not None
    float_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert one.float_weight_bytes == two.float_weight_bytes == float_bytes
    assert two.weight_bytes == one.weight_bytes  # the file stores them once either way
    assert two.weight_ratio == pytest.approx(one.weight_ratio)
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    if mode == "int8":  # layers static int8 quantizes, and the embedding as a table
        assert (one.quantized_ops, two.quantized_ops) == (linears, linears)
        assert [w.name for w in two.weights] == ["embed.weight"]
    else:
        assert two.quantized_ops == 0
        assert sorted(w.name for w in two.weights) == sorted(
            w.name for w in one.weights) == ["embed.weight", "fc1.weight", "fc2.weight"]


def test_two_methods_delegate_the_weights_of_one() -> None:
    from exirc.cli.delegation_text import summary_line

    model, decode, prefill = _model()
    options = CompileOptions(target="xnnpack")
    one = compile_module(model, decode, options=options).delegation
    two = compile_module(model, decode, methods={"prefill": (model, prefill)},
                         options=options).delegation
    linear_bytes = sum(p.numel() * p.element_size()
                       for m in (model.fc1, model.fc2) for p in m.parameters())
    assert unique_weight_bytes(one.values()) == linear_bytes
    assert unique_weight_bytes(two.values()) == linear_bytes
    assert sum(p.weight_bytes for r in two.values() for p in r.partitions) == 2 * linear_bytes
    line = summary_line(two)
    assert line is not None
    from exirc.inspector.render import human_bytes
    assert f"(weights {human_bytes(linear_bytes)})" in line, line
    # The JSON keeps its keys: the digests are for summing, not for programs.
    assert all("weight_digests" not in entry for r in two.values()
               for entry in r.to_json()["partitions"])
