"""Kernels ExecuTorch's XNNPACK partitioner leaves between its delegates run in the
fused chain (exirc.runtime.engines.onnx_form.chain_norms and friends): LayerNorm in each of its
forms (three outs at once), mean and sum reductions, a split into a list of outs,
indices the chain computes, x ** n, full_like, 0-d constants bound to a
delegate's [1]. Each file, lowered by ExecuTorch itself, runs as one session and
answers as the kernel-by-kernel run, eager and ExecuTorch's runtime do; an index
the session would wrap or refuse fails as the kernel does; near misses (other
exponents, a dtype argument) keep the method kernel by kernel, still right."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from exirc.runtime import load
from exirc.runtime.core.method import Method
from exirc.runtime.engines.onnxruntime.chain import FUSED
from tests.oracle import requires_executorch
from tests.runtime.delegates.xnnpack.zoo import (
    ZooModel,
    executorch_xnnpack_pte,
    run_with_executorch_runtime,
)
from tests.runtime.engines.onnx_form.test_chain import fails_as_the_kernels_do, kernel_by_kernel

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
# The ONNX chain's own translations are under test.
pytestmark = [requires_executorch, pytest.mark.oracle,
              pytest.mark.usefixtures("chains_on_onnxruntime")]


def lowered(name: str, build: Callable[[], nn.Module], *inputs: torch.Tensor
            ) -> tuple[Method, nn.Module, bytes]:
    """The module lowered by ExecuTorch, its forward as exirc loads it, and the file."""
    model = ZooModel(name, build, lambda: inputs)
    module = model.module()
    pte = executorch_xnnpack_pte(model)
    return load(pte).method("forward"), module, pte


def answers_as_everyone(method: Method, module: nn.Module, pte: bytes,
                        inputs: list[torch.Tensor], exact: bool = False) -> None:
    """Fused answers = kernel-by-kernel (bit for bit if `exact`), eager, ExecuTorch."""
    with torch.no_grad():
        expected = module(*inputs)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    theirs = run_with_executorch_runtime(pte, tuple(inputs))
    got, separate = method.run(inputs), kernel_by_kernel(method, inputs)
    for ours, other, want, their in zip(got, separate, expected, theirs, strict=True):
        assert ours.dtype == want.dtype and ours.shape == want.shape
        tolerance = {"rtol": 0, "atol": 0} if exact else {"rtol": 1e-5, "atol": 1e-6}
        torch.testing.assert_close(ours, other, **tolerance)
        torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours, their, rtol=1e-5, atol=1e-5)


class LayerNorms(nn.Module):
    """Linears with LayerNorms between them: affine, without bias, without weights,
    over the last two dims."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(8, 8), nn.Linear(8, 8)
        self.affine = nn.LayerNorm(8)
        self.no_bias = nn.LayerNorm(8, bias=False)
        self.plain = nn.LayerNorm(8, elementwise_affine=False)
        self.two_dims = nn.LayerNorm([3, 8])
        with torch.no_grad():
            for norm in (self.affine, self.no_bias, self.two_dims):
                norm.weight.uniform_(0.5, 1.5)
            self.affine.bias.uniform_(-1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.affine(self.first(x))
        y = self.no_bias(self.second(y)) + self.plain(y)
        return self.two_dims(self.first(y))


def test_layer_norms_fuse_in_each_form() -> None:
    x = torch.randn(2, 3, 8) * 3 + 1
    method, module, pte = lowered("layer_norms", LayerNorms, x)
    assert method.execution.startswith(FUSED), method.execution
    answers_as_everyone(method, module, pte, [x])
    # A mean far larger than the spread: as near torch's own kernel as eager allows.
    answers_as_everyone(method, module, pte, [x * 0.01 + 50])


class Pools(nn.Module):
    """Convolutions pooled by means over H and W (kept or not), a float sum, and a
    count of positive elements (a bool sum, added up in int64 as torch does)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.head = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.conv(x)
        kept = y.mean(dim=(-1, -2), keepdim=True)
        pooled = self.head(torch.flatten(y.mean(dim=[2, 3]), 1))
        return pooled, self.head(kept.flatten(1) * 2), y.sum(dim=1), (y > 0).sum(dim=(1, 2))


def test_means_and_sums_fuse() -> None:
    x = torch.randn(2, 3, 5, 5)
    method, module, pte = lowered("pools", Pools, x)
    assert method.execution.startswith(FUSED), method.execution
    answers_as_everyone(method, module, pte, [x])
    assert method.run([x])[3].dtype == torch.int64


class GateSplit(nn.Module):
    """An LSTM-like gate split of a linear's result, unequal sizes, each part used."""

    def __init__(self) -> None:
        super().__init__()
        self.gates = nn.Linear(6, 12)
        self.out = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, c = torch.split(self.gates(x), [5, 5, 2], dim=-1)
        return self.out(torch.sigmoid(a) * torch.tanh(b)) + c.sum(-1, keepdim=True)


def test_a_split_into_a_list_of_outs_fuses() -> None:
    x = torch.randn(3, 6)
    method, module, pte = lowered("gate_split", GateSplit, x)
    assert method.execution.startswith(FUSED), method.execution
    answers_as_everyone(method, module, pte, [x])


class ComputedIndex(nn.Module):
    """Rows of a linear's result picked by indices the program computes (i + 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x)[i + 1])


def test_computed_indices_fuse_and_fail_as_the_kernel_does() -> None:
    x, i = torch.randn(5, 4), torch.tensor([0, 2, -3])
    method, module, pte = lowered("computed_index", ComputedIndex, x, i)
    assert method.execution.startswith(FUSED), method.execution
    answers_as_everyone(method, module, pte, [x, i], exact=True)
    wrapped = torch.tensor([-6, 3, -2])  # i + 1: -5 (the first row), 4, -1
    answers_as_everyone(method, module, pte, [x, wrapped], exact=True)
    for beyond in (torch.tensor([0, 4, 1]), torch.tensor([-7, 0, 0])):  # rows 5 and -6
        error = fails_as_the_kernels_do(method, [x, beyond])
        assert "index" in str(error).lower()
    answers_as_everyone(method, module, pte, [x, i], exact=True)  # the session still serves


class Powers(nn.Module):
    """x ** n between linears (of |x| for a root)."""

    def __init__(self, exponents: tuple[float, ...]) -> None:
        super().__init__()
        self.exponents = exponents
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.first(x)
        if any(n != int(n) for n in self.exponents):
            y = y.abs()
        return self.second(sum(torch.pow(y, n) for n in self.exponents))


def test_powers_computed_as_products_fuse_bit_for_bit() -> None:
    x = torch.randn(6, 4)
    method, module, pte = lowered("powers", lambda: Powers((2, 3.0, -1, -2.0)), x)
    assert method.execution.startswith(FUSED), method.execution
    answers_as_everyone(method, module, pte, [x], exact=True)


def test_other_exponents_keep_the_method_kernel_by_kernel() -> None:
    x = torch.randn(6, 4)
    method, module, pte = lowered("half_power", lambda: Powers((0.5,)), x)
    assert "x ** 0.5" in method.execution and method.accelerated is None, method.execution
    answers_as_everyone(method, module, pte, [x])


class SafeSoftmaxAndHardswish(nn.Module):
    """Attention scores through torch's safe softmax (full_like between delegates),
    then hardswish, whose 0-d constants ExecuTorch binds to the delegate as [1]."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attended = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
        return F.hardswish(attended * 3)


def test_safe_softmax_and_zero_d_constants_fuse() -> None:
    x = torch.randn(2, 5, 8)
    method, module, pte = lowered("softmax_hardswish", SafeSoftmaxAndHardswish, x)
    assert method.execution.startswith(FUSED), method.execution
    answers_as_everyone(method, module, pte, [x])
