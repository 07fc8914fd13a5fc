"""Kernels that read only constants are computed at load by torch itself
(exirc.runtime.engines.onnx_form.chain_folding), so an op with no ONNX form no longer keeps an
ExecuTorch file kernel by kernel: the same bits as the kernels, every run. Random
ops are never frozen. Casts from float to integers agree with torch's kernel
even where C++ leaves them undefined (NaN, infinities, overflow); repeat and
integer minimum/maximum fuse."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exirc.runtime.engines.onnxruntime.chain import FUSED
from exirc.runtime.kernels.registry import KERNELS, Kernel, parse_schema
from tests.runtime.engines.onnx_form.test_chain import fails_as_the_kernels_do, kernel_by_kernel
from tests.runtime.engines.onnx_form.test_chain_norms import answers_as_everyone, lowered

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
# The ONNX chain's own translations are under test.
pytestmark = pytest.mark.usefixtures("chains_on_onnxruntime")


class ConstantTables(nn.Module):
    """T5-like relative-position buckets (abs has no ONNX form) and BLOOM-like slopes
    (pow of a constant by an arange), computed from constants inside forward."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(6)
        buckets = torch.abs(positions[None, :] - positions[:, None])
        slopes = torch.pow(torch.full((), 0.75), torch.arange(1, 7, dtype=torch.int32))
        return self.linear(x) * slopes + buckets, buckets


def test_kernels_of_constants_are_folded_at_load_with_torchs_bits() -> None:
    x = torch.randn(6, 6)
    method, module, pte = lowered("constant_tables", ConstantTables, x)
    assert method.execution.startswith(FUSED), method.execution
    answers_as_everyone(method, module, pte, [x], exact=True)
    answers_as_everyone(method, module, pte, [torch.randn(6, 6)], exact=True)


def test_a_kernel_failing_on_its_constants_refuses_the_chain_with_its_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Its arguments are the same every run, so it fails every run: the chain is not
    # fused around it (a translation might answer where the kernel raises), the
    # refusal says why, and run kernel by kernel the method raises the kernel's error.
    def refusing(*args: object, **kwargs: object) -> None:
        raise ValueError("a table the kernel refuses\nsecond line")

    key = "aten::abs.out"
    monkeypatch.setitem(KERNELS._kernels, key, Kernel(key, parse_schema(key), refusing))
    x = torch.randn(6, 6)
    method, _, _ = lowered("constant_tables_refused", ConstantTables, x)
    assert method.accelerated is None
    assert "aten::abs.out fails on its constant arguments (ValueError: a table the kernel " \
           "refuses)" in method.execution, method.execution
    with pytest.raises(Exception, match="a table the kernel refuses"):
        method.run([x])


class Noisy(nn.Module):
    """Noise drawn inside forward: a kernel of no inputs, never the same twice."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + torch.rand(4)


def test_random_kernels_are_never_frozen() -> None:
    x = torch.randn(2, 4)
    method, _, _ = lowered("noisy", Noisy, x)
    assert method.accelerated is None and "rand" in method.execution, method.execution
    assert not torch.equal(method.run([x])[0], method.run([x])[0])


class Casts(nn.Module):
    """A linear's result cast to int64, int32 and int8 (after a scale that sends some
    elements out of range), repeated, and an integer minimum."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.linear(x) * scale
        wide = y.to(torch.int64)
        return (wide, y.to(torch.int32), y.to(torch.int8),
                torch.minimum(wide, torch.full_like(wide, 3)), y.repeat(2, 1, 3))


@pytest.mark.parametrize("scale", [1.0, 1e3, 1e12, 1e40, float("nan")])
def test_float_to_integer_casts_are_torchs_even_out_of_range(scale: float) -> None:
    x = torch.randn(3, 4) * 4
    method, module, pte = lowered("casts", Casts, x, torch.tensor(2.0))
    assert method.execution.startswith(FUSED), method.execution
    inputs = [x, torch.tensor(scale)]
    got, separate = method.run(inputs), kernel_by_kernel(method, inputs)
    with torch.no_grad():
        expected = module(*inputs)
    # The linear rounds as the delegate does, so its casts are compared with the
    # kernel-by-kernel run (the same delegate), bit for bit; with eager, the float output.
    for ours, other, want in zip(got, separate, expected, strict=True):
        assert ours.dtype == want.dtype and ours.shape == want.shape
        torch.testing.assert_close(ours, other, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got[-1], expected[-1], rtol=1e-5, atol=1e-5, equal_nan=True)
    if scale == 1e40:  # every element out of range: what torch's kernel gives, as a constant
        assert got[0].unique().numel() == 1 and got[1].unique().numel() == 1


class MasksAndProducts(nn.Module):
    """DeBERTa- and Megatron-like masks (a float mask cast to bool, inverted), a pick
    along the last dim (x[:, :, i], Falcon's rotary halves) and, as in Falcon's file,
    a product of two delegates' results left between them."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(4, 6), nn.Linear(4, 6)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, i: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        dropped = ~mask.bool()
        scores = self.first(x) @ self.second(x).transpose(-1, -2)  # a bmm XNNPACK takes
        product = self.first(x[0]) @ self.second(x[0]).T  # an mm it leaves between them
        return (scores.masked_fill(dropped[:, None, :], 0.0), product, self.first(x)[:, :, i],
                dropped, ~i)


def test_masks_picks_and_products_between_delegates_fuse() -> None:
    x, i = torch.randn(2, 3, 4), torch.tensor([0, -1, 5])
    mask = torch.tensor([[1.0, 0.0, float("nan")], [-0.0, 2.5, 1.0]])
    method, module, pte = lowered("masks_products", MasksAndProducts, x, mask, i)
    assert method.execution.startswith(FUSED), method.execution
    answers_as_everyone(method, module, pte, [x, mask, i])
    got, separate = method.run([x, mask, i]), kernel_by_kernel(method, [x, mask, i])
    for ours, other in zip(got[2:], separate[2:], strict=True):  # moves and masks: bit for bit
        torch.testing.assert_close(ours, other, rtol=0, atol=0)
    error = fails_as_the_kernels_do(method, [x, mask, torch.tensor([0, 6, 1])])
    assert "index" in str(error).lower()
