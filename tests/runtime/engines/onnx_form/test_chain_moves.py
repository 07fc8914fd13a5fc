"""Kernels that only move or fill data run in the fused chain
(exirc.runtime.engines.onnx_form.chain_moves): integer token ids sliced, permuted,
selected (a negative index too), concatenated (with a constant), reshaped and
filled before embedding lookups, which the XNNPACK partitioner leaves out of
its delegates. The method fuses and answers exactly as the kernel-by-kernel
run and eager do."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

from exirc.compiler import CompileOptions, compile_module
from exirc.runtime import load
from tests.runtime.engines.onnx_form.test_chain import kernel_by_kernel

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


class MovedIds(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.linear = nn.Embedding(30, 4), nn.Linear(4, 3)
        self.register_buffer("extra", torch.tensor([[7, 8]]))

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        picked = [
            ids[:, 1:6:2],                                    # slice with a step
            ids[:, -3:],                                      # slice from the end
            ids.permute(1, 0),                                # permute
            ids[-1],                                          # select, negative index
            torch.cat([ids[:1, :2], self.extra], dim=0),      # cat with a constant
            ids.reshape(3, 4).unsqueeze(0).squeeze(0),        # view, unsqueeze, squeeze
            torch.full((2, 2), 5) + ids[:, :2],               # fill
        ]
        return tuple(self.linear(self.embed(p)) for p in picked)


def test_moved_and_filled_ids_run_fused_exactly() -> None:
    torch.manual_seed(0)
    model = MovedIds().eval()
    ids = torch.randint(0, 20, (2, 6))
    method = load(compile_module(model, [ids], options=CompileOptions(target="xnnpack")).data
                  ).method("forward")
    assert method.accelerated is not None, "the chain was expected to fuse"
    fused = onnx.load_from_string(method.accelerated.form.model)
    ops = Counter(node.op_type for node in fused.graph.node)
    assert ops["Slice"] >= 2 and ops["Transpose"] >= 1 and ops["Concat"] >= 1, ops
    for other in (ids, torch.randint(0, 20, (2, 6))):
        with torch.no_grad():
            expected = model(other)
        for got, kernels, want in zip(method.run([other]), kernel_by_kernel(method, [other]),
                                      expected, strict=True):
            torch.testing.assert_close(got, kernels, rtol=0, atol=0)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
