"""Kernels around transformers' delegates run in the fused chain
(exirc.runtime.engines.onnx_form.chain_arith): an expanded attention mask, position ids
from a padding mask (cumsum, integer arithmetic of mixed dtypes, gather),
arange, a log-softmax head. Each model fuses, answers as the kernel-by-kernel
run and eager do, and a gather index the session would wrap or refuse fails
as the kernel does; near misses (float cumsum, alpha, a float/int mix) keep
the method kernel by kernel, still right."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exirc.compiler import CompileOptions, compile_module
from exirc.runtime import load
from exirc.runtime.core.method import Method
from tests.runtime.engines.onnx_form.test_chain import fails_as_the_kernels_do, kernel_by_kernel

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def method_of(model: nn.Module, inputs: list[torch.Tensor], target: str = "xnnpack") -> Method:
    data = compile_module(model, inputs, options=CompileOptions(target=target)).data
    return load(data).method("forward")


def answers_as_kernels_and_eager(method: Method, model: nn.Module,
                                 inputs: list[torch.Tensor]) -> None:
    with torch.no_grad():
        expected = model(*inputs)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    for got, other, want in zip(method.run(inputs), kernel_by_kernel(method, inputs), expected,
                                strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, other, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


class MaskedScores(nn.Module):
    """An all-true mask over the keys, expanded to [B, T, T] (transformers 5's
    bidirectional mask), selecting a delegate's scores."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.arange(5) >= 0
        mask = keep[None, None, :].expand(x.shape[0], 5, -1)
        return torch.softmax(torch.where(mask, self.linear(x), float("-inf")), dim=-1)


class PositionIds(nn.Module):
    """RoBERTa's position ids from a padding mask (int32 cumsum into int64, sums
    and products of int32 and int64), and a log-softmax head."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(20, 8), nn.Embedding(12, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = ids.ne(1).int()
        positions = (torch.cumsum(mask, dim=1).type_as(mask) + 0) * mask
        positions = positions.long() + 1
        hidden = self.tokens(ids) + self.positions(positions)
        return torch.log_softmax(self.head(hidden), dim=-1), positions


class GatheredTypes(nn.Module):
    """A token-type table expanded over the batch and gathered at the given
    positions (RoBERTa's buffered token type ids), plus arange positions."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("types", torch.tensor([[0, 1, 1, 0, 1, 0, 0, 1]]))
        self.embed, self.place = nn.Embedding(2, 6), nn.Embedding(8, 6)
        self.linear = nn.Linear(6, 3)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        types = torch.gather(self.types.expand(positions.shape[0], -1), 1, positions)
        places = torch.arange(positions.shape[1]).expand(positions.shape[0], -1)
        return self.linear(self.embed(types) + self.place(places))


def test_an_expanded_mask_runs_fused() -> None:
    model, x = MaskedScores().eval(), torch.randn(2, 5, 6)
    method = method_of(model, [x])
    assert method.accelerated is not None
    answers_as_kernels_and_eager(method, model, [x])


def test_position_ids_from_a_padding_mask_and_a_log_softmax_run_fused() -> None:
    torch.manual_seed(0)
    model = PositionIds().eval()
    ids = torch.tensor([[5, 7, 1, 1, 9, 3], [1, 2, 3, 4, 5, 6]])
    method = method_of(model, [ids])
    assert method.accelerated is not None
    answers_as_kernels_and_eager(method, model, [ids])
    other = torch.tensor([[1, 1, 1, 1, 1, 1], [2, 2, 2, 2, 2, 2]])
    answers_as_kernels_and_eager(method, model, [other])


def test_a_gather_runs_fused_and_a_bad_index_fails_as_the_kernel_does() -> None:
    torch.manual_seed(0)
    model = GatheredTypes().eval()
    positions = torch.tensor([[0, 3, 2, 7, 1], [6, 6, 5, 4, 0]])
    method = method_of(model, [positions])
    assert method.accelerated is not None
    answers_as_kernels_and_eager(method, model, [positions])
    for bad in (-1, 8):  # ONNX would wrap -1; 8 is past the end
        wrong = positions.clone()
        wrong[1, 2] = bad
        assert "gather" in str(fails_as_the_kernels_do(method, [wrong]))
    answers_as_kernels_and_eager(method, model, [positions])  # and right again after


class NearMisses(nn.Module):
    """A float cumsum and an integer add with alpha 2 keep the method kernel by
    kernel; their translatable twins (an integer cumsum, alpha 1) do not."""

    def __init__(self, variant: str) -> None:
        super().__init__()
        self.variant, self.linear = variant, nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.linear(x)
        if self.variant.endswith("cumsum"):
            return y, torch.cumsum(y if self.variant == "float_cumsum" else ids, dim=1)
        return y, torch.add(ids, ids, alpha=2 if self.variant == "alpha" else 1)


@pytest.mark.parametrize(("variant", "fuses"), [
    ("float_cumsum", False), ("alpha", False), ("int_cumsum", True), ("no_alpha", True)])
def test_near_misses_stay_kernel_by_kernel_and_right(variant: str, fuses: bool) -> None:
    model = NearMisses(variant).eval()
    inputs = [torch.randn(3, 4), torch.tensor([[1, 2], [3, 2**62]])]  # sums wrap around
    method = method_of(model, inputs)
    assert (method.accelerated is not None) == fuses
    answers_as_kernels_and_eager(method, model, inputs)


class Comparisons(nn.Module):
    """Token ids compared with scalars and with each other (integer masks)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 4)

    def forward(self, ids: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = self.embed(ids)
        masks = [ids >= 3, ids > 3, ids <= 17, ids < 17, ids == other, ids != other,
                 ids >= other, ids > other, ids <= other, ids < other]
        return tuple(torch.where(m[..., None], hidden, torch.zeros_like(hidden)) for m in masks)


def test_comparisons_run_fused_exactly() -> None:
    torch.manual_seed(0)
    model = Comparisons().eval()
    ids = torch.tensor([[3, 17, 2, 18], [5, 5, 0, 19]])
    other = torch.tensor([[3, 16, 4, 18], [6, 5, 0, 1]])
    method = method_of(model, [ids, other])
    assert method.accelerated is not None
    answers_as_kernels_and_eager(method, model, [ids, other])
