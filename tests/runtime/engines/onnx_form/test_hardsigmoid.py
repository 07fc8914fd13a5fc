"""A decomposed hard sigmoid in the ONNX form is one HardSigmoid node
(exirc.runtime.engines.onnx_form.rewrites.hardsigmoid): a squeeze-excite gate compiled for
XNNPACK runs on onnxruntime with the torch engine's and eager's answers, with
the expected number of HardSigmoid nodes; near-misses (another divisor, the
clipped sum read elsewhere) stay as they are and still give eager's answers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.runtime.engines.onnx_form.test_fusions import (  # noqa: F401 (onnx_ops: a fixture)
    compiled_against_eager,
    onnx_ops,
)

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

RTOL, ATOL = 1e-4, 1e-5  # the conformance zoo's (tests/models/zoo.py)


class SqueezeExcite(nn.Module):
    """A convolution gated by hardsigmoid of its pooled channels; `variant` breaks
    the gate: "divisor" divides by 5, "clip_read" also returns relu6(z + 3)."""

    def __init__(self, variant: str = "") -> None:
        super().__init__()
        self.variant = variant
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.expand = nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.conv(x)
        z = self.expand(y.mean((2, 3), keepdim=True))
        clipped = F.relu6(z + 3)
        if self.variant == "divisor":
            gate = clipped / 5
        elif self.variant == "clip_read":
            gate = clipped / 6  # a hard sigmoid written out, its clipped sum returned too
        else:
            gate = F.hardsigmoid(z)
        out = y * gate
        return (out, clipped) if self.variant == "clip_read" else (out,)


@pytest.mark.parametrize(("variant", "fused"), [("", 1), ("divisor", 0), ("clip_read", 0)],
                         ids=["hardsigmoid", "another_divisor", "clipped_sum_read_elsewhere"])
def test_a_hard_sigmoid_is_one_node_with_eager_answers(
        variant: str, fused: int, onnx_ops: list[list[str]],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = SqueezeExcite(variant).eval()
    inputs = [torch.randn(1, 3, 6, 6) * 3]  # gates across the clip's both ends
    compiled_against_eager(model, inputs, monkeypatch, RTOL, ATOL)
    ops = [op for delegate in onnx_ops for op in delegate]
    assert ops.count("HardSigmoid") == fused, ops
    assert ("Div" in ops) == (not fused), ops
