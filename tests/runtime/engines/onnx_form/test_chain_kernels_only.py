"""A chain of kernels alone, with no delegate, runs as one onnxruntime session when
every kernel translates bit for bit and there are enough of them
(exirc.runtime.engines.onnx_form.chain): the same bits as the kernel-by-kernel run, eager's
answers; and it stays kernel by kernel, still right, when a kernel would round
otherwise, when the chain is too short to repay a session, when torch is asked
for, or when onnxruntime is missing."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from exirc.compiler import CompileOptions, compile_module
from exirc.runtime import load
from exirc.runtime.core.method import Method
from exirc.runtime.engines.onnxruntime.chain import FUSED
from exirc.runtime.engines.policy import ENGINE_VARIABLE
from tests.models.zoo import AddOnes
from tests.runtime.engines.onnx_form.test_chain import kernel_by_kernel
from tests.runtime.engines.onnx_form.test_chain_arith import method_of

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


class PaddingPositions(nn.Module):
    """Position ids and a float mask from token ids, as tokenizer-side code computes
    them: comparisons, a cumsum of bools, integer and mixed-dtype arithmetic."""

    def forward(self, ids: torch.Tensor, scores: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mask = ids != 0
        positions = torch.cumsum(mask, dim=-1) * mask + 1
        weights = mask * 2.5 - 1
        return positions, (scores * weights + 3) * scores, ids.unsqueeze(1).expand(-1, 3, -1)


def portable(model: nn.Module, *inputs: torch.Tensor) -> Method:
    return method_of(model, list(inputs), target="portable")


def same_bits_as_kernels_and_eager(method: Method, model: nn.Module,
                                   inputs: list[torch.Tensor]) -> None:
    with torch.no_grad():
        expected = model(*inputs)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    got = method.run(inputs)
    for ours, other, want in zip(got, kernel_by_kernel(method, inputs), expected, strict=True):
        assert ours.dtype == want.dtype
        torch.testing.assert_close(ours, other, rtol=0, atol=0)
        torch.testing.assert_close(ours, want, rtol=0, atol=0)


def ids_and_scores() -> list[torch.Tensor]:
    ids = torch.tensor([[5, 9, 0, 0], [3, 0, 7, 1]])
    return [ids, torch.randn(2, 4) * 1e3]


def test_a_portable_chain_of_exact_kernels_is_one_session() -> None:
    model, inputs = PaddingPositions(), ids_and_scores()
    method = portable(model, *inputs)
    assert method.execution.startswith(FUSED), method.execution
    same_bits_as_kernels_and_eager(method, model, inputs)
    other = [torch.tensor([[0, 0, 0, 2], [1, 1, 1, 1]]), torch.randn(2, 4)]
    same_bits_as_kernels_and_eager(method, model, other)  # new inputs are read


def test_a_long_add_chain_is_one_session_with_the_same_bits() -> None:
    model = AddOnes(60)
    x = torch.tensor([0.1, -3.7, 1e7, float("inf")])  # 1e7 + 1 rounds in float32
    method = portable(model, x)
    assert method.execution.startswith(FUSED), method.execution
    same_bits_as_kernels_and_eager(method, model, [x])


def test_a_kernel_that_would_round_otherwise_keeps_the_chain_on_torch() -> None:
    class Normalised(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.log_softmax(x * 2 + 1, dim=-1) - x.mean(-1, keepdim=True)

    model, x = Normalised(), torch.randn(3, 5)
    method = portable(model, x)
    assert method.accelerated is None
    assert "would round otherwise on onnxruntime" in method.execution, method.execution
    same_bits_as_kernels_and_eager(method, model, [x])


def test_a_short_chain_is_not_worth_a_session() -> None:
    model, x = AddOnes(3), torch.randn(4)
    method = portable(model, x)
    assert method.accelerated is None
    assert "3 kernel calls: fewer than 4" in method.execution, method.execution
    same_bits_as_kernels_and_eager(method, model, [x])


def test_the_reference_when_asked_for_or_when_onnxruntime_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model, inputs = PaddingPositions(), ids_and_scores()
    data = compile_module(model, tuple(inputs), options=CompileOptions(target="portable")).data
    monkeypatch.setenv(ENGINE_VARIABLE, "reference")
    method = load(data).method("forward")
    assert method.accelerated is None and f"{ENGINE_VARIABLE}='reference'" in method.execution
    same_bits_as_kernels_and_eager(method, model, inputs)
    monkeypatch.delenv(ENGINE_VARIABLE)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` fails
    method = load(data).method("forward")
    assert method.accelerated is None and "onnx is not installed" in method.execution
    same_bits_as_kernels_and_eager(method, model, inputs)


class Truncations(nn.Module):
    """Float to integer casts of every signed width, at and around their bounds."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.to(torch.int32), x.to(torch.int64), x.to(torch.int8), x.to(torch.int16),
                y.to(torch.int32), y.to(torch.int64))


def test_float_to_integer_casts_match_torch_at_every_bound() -> None:
    bounds = [2.0 ** 31, 2.0 ** 63, 128.0, 32768.0]
    edges = [v for b in bounds for v in (b, -b, b - 1, -b - 1, b - 0.5, -b + 0.5, -b - 0.5)]
    x32 = torch.tensor(edges + [float("nan"), float("inf"), -float("inf"), 0.9, -0.9, -0.0])
    x32 = torch.cat([x32, torch.nextafter(x32, torch.full_like(x32, float("inf"))),
                     torch.nextafter(x32, torch.full_like(x32, -float("inf")))])
    x64 = x32.double() + torch.tensor([0.25]).double()
    model = Truncations()
    method = portable(model, x32, x64)
    assert method.execution.startswith(FUSED), method.execution
    same_bits_as_kernels_and_eager(method, model, [x32, x64])
