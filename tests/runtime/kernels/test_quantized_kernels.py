"""ExecuTorch's quantized kernel library in exirc's runtime, kernel by kernel.

The oracle is ExecuTorch's own C++: `import executorch.kernels.quantized`
loads its kernels into `torch.ops.quantized_decomposed.*.out` (built in ATen
mode from the same sources as its runtime's). Integer results must be equal;
float results too, since the kernels redo the C++ arithmetic step by step.
torch's reference ops (`torch.ao.quantization.fx._decomposed`) and
ExecuTorch's Python references for the embeddings are checked where their
arithmetic is the same. Hostile arguments: `test_quantized_hostile.py`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from exirc.runtime.kernels import quantized as K
from exirc.runtime.kernels import quantized_affine as A
from exirc.runtime.kernels import quantized_embedding as E
from exirc.runtime.kernels.registry import KERNELS, parse_schema
from exirc.targets import kernel_list

NAN, INF = float("nan"), float("inf")
RANGES = {torch.uint8: (0, 255), torch.int8: (-128, 127), torch.int16: (-(2 ** 15), 2 ** 15 - 1),
          torch.int32: (-(2 ** 31), 2 ** 31 - 1), torch.uint16: (0, 2 ** 16 - 1)}


@pytest.fixture(scope="module")
def et() -> Any:
    """torch.ops.quantized_decomposed with ExecuTorch's C++ out-variants and torch's
    reference ops."""
    pytest.importorskip("executorch")
    import executorch.kernels.quantized  # noqa: F401
    import torch.ao.quantization.fx._decomposed  # noqa: F401

    return torch.ops.quantized_decomposed


@pytest.fixture(scope="module")
def et_references(et: Any) -> Any:
    """Also ExecuTorch's Python references for the embeddings (which load its exir: slow)."""
    import executorch.exir.passes._quant_patterns_and_replacements  # noqa: F401

    return et


def same(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert torch.equal(ours.nan_to_num(), theirs.nan_to_num()), (ours - theirs).abs().max()


def both(et_op: Any, ours: Callable[..., Any], args: tuple[Any, ...], out: torch.Tensor,
         **kwargs: Any) -> torch.Tensor:
    """Run ExecuTorch's kernel and ours on the same arguments; assert equal results."""
    theirs = torch.empty_like(out)
    et_op(*args, **kwargs, out=theirs)
    mine = torch.empty(0, dtype=out.dtype)  # ours must size its out, as for dynamic shapes
    assert ours(*args, **kwargs, out=mine) is mine
    same(mine, theirs)
    return mine


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------


def test_table_is_the_kernel_list_and_registered() -> None:
    names = {parse_schema(spec).name + "." + parse_schema(spec).overload_name
             for spec in K.QUANTIZED_KERNELS}
    assert len(names) == 19 and names == kernel_list("quantized")
    for spec, fn in K.QUANTIZED_KERNELS.items():
        schema = parse_schema(spec)
        kernel = KERNELS.find(schema.name, schema.overload_name)
        assert kernel is not None and kernel.fn is fn and kernel.schema == schema


def test_schemas_are_executorchs() -> None:
    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("needs ExecuTorch's quantized.yaml")
    path = Path(list(spec.submodule_search_locations)[0]) / "kernels/quantized/quantized.yaml"
    theirs = {str(parse_schema(entry["func"])) for entry in yaml.safe_load(path.read_text())}
    assert {str(parse_schema(s)) for s in K.QUANTIZED_KERNELS} == theirs


# ---------------------------------------------------------------------------
# quantize
# ---------------------------------------------------------------------------


def hard_floats(dtype: torch.dtype) -> torch.Tensor:
    """Random values with ties, saturation, NaN, infinities and values beyond int64."""
    special = [0.5, 1.5, 2.5, -0.5, -2.5, 126.5, 127.5, -128.5, 1e30, -1e30, 3e9, 1e19,
               NAN, INF, -INF, 0.0, -0.0]
    generator = torch.Generator().manual_seed(0)
    return torch.cat([torch.randn(500, generator=generator) * 300,
                      torch.tensor(special)]).to(dtype)


@pytest.mark.parametrize("dtype", list(RANGES))
@pytest.mark.parametrize("input_dtype", [torch.float32, torch.float64, torch.float16])
def test_quantize_per_tensor_is_executorchs(et: Any, dtype: torch.dtype,
                                            input_dtype: torch.dtype) -> None:
    low, high = RANGES[dtype]
    x = hard_floats(input_dtype)
    out = torch.empty(x.shape, dtype=dtype)
    for scale, zero_point in [(0.1, 0), (0.0123456789, -7), (1.0, 2 ** 31 + 5), (0.0, 0),
                              (1e-40, 3)]:
        for quant_min, quant_max in [(low, high), (low + 1, high - 2), (5, 3)]:
            args = (x, scale, zero_point, quant_min, quant_max, dtype)
            both(et.quantize_per_tensor.out, A.quantize_per_tensor_out, args, out)
        both(et.quantize_per_tensor.Tensor_out, A.quantize_per_tensor_tensor_out,
             (x, torch.tensor([scale], dtype=torch.float64), torch.tensor([zero_point]),
              low, high, dtype), out)


def test_quantize_rounds_ties_to_even_and_saturates(et: Any) -> None:
    scale = 0.25  # a power of two: torch's reference multiplies by the same inverse
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, 1000.0, -1000.0]) * scale
    out = torch.empty(x.shape, dtype=torch.int8)
    A.quantize_per_tensor_out(x, scale, 0, -128, 127, torch.int8, out=out)
    assert out.tolist() == [0, 2, 2, 0, -2, -2, 126, 127, 127, -128]
    reference = et.quantize_per_tensor.default(x, scale, 0, -128, 127, torch.int8)
    same(out, reference)
    A.quantize_per_tensor_out(x, scale, 3, -5, 5, torch.int8, out=out)
    assert out.tolist() == [3, 5, 5, 3, 1, 1, 5, 5, 5, -5]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16])
@pytest.mark.parametrize(("shape", "axis"), [((4, 5, 6), 0), ((4, 5, 6), 1), ((4, 5, 6), -1),
                                              ((7,), 0)])
def test_quantize_and_dequantize_per_channel_are_executorchs(
        et: Any, dtype: torch.dtype, shape: tuple[int, ...], axis: int) -> None:
    low, high = RANGES[dtype]
    generator = torch.Generator().manual_seed(1)
    channels = shape[axis]
    scales = torch.rand(channels, dtype=torch.float64, generator=generator) * 0.1 + 1e-3
    zeros = torch.randint(low, high, (channels,), generator=generator)
    x = torch.randn(shape, generator=generator) * 10
    both(et.quantize_per_channel.out, A.quantize_per_channel_out,
         (x, scales, zeros, axis, low, high, dtype), torch.empty(shape, dtype=dtype))
    q = torch.randint(low, high, shape, generator=generator).to(dtype)
    for out_dtype in (torch.float32, torch.float64, torch.float16):
        for zero_points in (zeros, zeros.int(), None):
            for scale in (scales, scales.float()):
                args = (q, scale, zero_points, axis, low, high, dtype)
                both(et.dequantize_per_channel.out, A.dequantize_per_channel_out, args,
                     torch.empty(shape, dtype=out_dtype), out_dtype=out_dtype)


@pytest.mark.parametrize("shape", [(3, 4, 5), (6,), (2, 1, 8)])
def test_per_token_ops_are_executorchs(et: Any, shape: tuple[int, ...]) -> None:
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(shape, generator=generator) * 5
    x.view(-1)[min(1, x.numel() - 1)] = NAN  # skipped: not a row's first element
    parameters = shape[:-1] + (1,)
    scales, zeros = torch.empty(parameters, dtype=torch.float64), torch.empty(
        parameters, dtype=torch.int64)
    et.choose_qparams_per_token_asymmetric.out(x, torch.int8, scale_out=scales,
                                               zero_point_out=zeros)
    mine = torch.empty(0, dtype=torch.float64), torch.empty(0, dtype=torch.int64)
    K.choose_qparams_per_token_asymmetric_out(x, torch.int8, scale_out=mine[0],
                                              zero_point_out=mine[1])
    same(mine[0], scales)
    same(mine[1], zeros)
    q = both(et.quantize_per_token.out, A.quantize_per_token_out,
             (x, scales, zeros, -128, 127, torch.int8), torch.empty(shape, dtype=torch.int8))
    for out_dtype in (torch.float32, torch.float16):
        both(et.dequantize_per_token.out, A.dequantize_per_token_out,
             (q, scales, zeros, -128, 127, torch.int8, out_dtype),
             torch.empty(shape, dtype=out_dtype))


# ---------------------------------------------------------------------------
# dequantize, choose_qparams, add
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(RANGES))
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float64, torch.float16])
def test_dequantize_per_tensor_is_executorchs(et: Any, dtype: torch.dtype,
                                              out_dtype: torch.dtype) -> None:
    low, high = RANGES[dtype]
    generator = torch.Generator().manual_seed(3)
    q = torch.randint(low, high + 1, (500,), generator=generator, dtype=torch.int64).to(dtype)
    out = torch.empty(q.shape, dtype=out_dtype)
    for scale, zero_point in [(0.1, 0), (0.0123456789, -7), (3.0, 2 ** 31 + 5), (INF, 0)]:
        args = (q, scale, zero_point, low, high, dtype)
        mine = both(et.dequantize_per_tensor.out, A.dequantize_per_tensor_out, args, out,
                    out_dtype=out_dtype)
        # torch's reference converts q to float first: the same while that is exact.
        if out_dtype == torch.float32 and dtype != torch.int32 and abs(zero_point) < 2 ** 20 \
                and scale != INF:
            same(mine, et.dequantize_per_tensor.default(*args, out_dtype=out_dtype))
    both(et.dequantize_per_tensor.Tensor_out, A.dequantize_per_tensor_tensor_out,
         (q, torch.tensor([0.05], dtype=torch.float64), torch.tensor([2]), low, high, dtype),
         out, out_dtype=out_dtype)


@pytest.mark.parametrize("values", [
    [1.0, NAN, -2.0], [0.0] * 5, [1e-9, 2e-9], [-1e-9, 0.0], [-3.0, INF], [5.0],
    [-1e-30, 1e-30], [1.0, 2.0, NAN, 7.0, -3.0], [-0.7, 2.1]])
def test_choose_qparams_is_executorchs(et: Any, values: list[float]) -> None:
    x = torch.tensor(values)
    for quant_min, quant_max in [(0, 255), (-128, 127), (-8, 7), (0, 2 ** 26)]:
        theirs = torch.empty(1, dtype=torch.float64), torch.empty(1, dtype=torch.int64)
        et.choose_qparams.Tensor_out(x, quant_min, quant_max, 1e-7, torch.uint8,
                                     scale_out=theirs[0], zero_point_out=theirs[1])
        mine = torch.empty(1, dtype=torch.float64), torch.empty(1, dtype=torch.int64)
        result = K.choose_qparams_tensor_out(x, quant_min, quant_max, 1e-7, torch.uint8,
                                             scale_out=mine[0], zero_point_out=mine[1])
        assert result == mine
        same(mine[0], theirs[0])
        same(mine[1], theirs[1])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32,
                                   torch.int64])
def test_add_is_executorchs(et: Any, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(4)
    a, b = (torch.randint(0, 256, (2, 300), generator=generator).to(dtype) for _ in "ab")
    for sa, za, sb, zb, so, zo in [(0.1, 3, 0.2, 100, 0.25, 5), (0.0123, 128, 0.0456, 0, 0.05, 255),
                                   (1.0, 0, 1.0, 0, 0.5, 0), (0.02, -5, 0.03, 300, 0.0, 7)]:
        both(et.add.out, K.add_out, (a, sa, za, 0, 255, b, sb, zb, 0, 255, so, zo, 10, 250),
             torch.empty(a.shape, dtype=dtype))


# ---------------------------------------------------------------------------
# mixed matmuls, embeddings
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mixed_matmuls_are_executorchs(et: Any, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(5, 37, generator=generator).to(dtype)
    weight = torch.randint(-128, 128, (37, 11), generator=generator, dtype=torch.int8)
    scales = (torch.rand(37, generator=generator) * 0.1).to(dtype)
    both(et.mixed_mm.out, E.mixed_mm_out, (x, weight, scales, None),
         torch.empty(5, 11, dtype=dtype))
    weight = torch.randint(-128, 128, (13, 37), generator=generator, dtype=torch.int8)
    for groups in (None, 1, 4, 6):
        shape = (13,) if groups is None else (13, groups)
        scales = (torch.rand(shape, generator=generator) * 0.1).to(dtype)
        for out_dtype in (torch.float32, torch.float16, torch.float64):
            both(et.mixed_linear.out, E.mixed_linear_out, (x, weight, scales, None, None),
                 torch.empty(5, 13, dtype=out_dtype))
        both(et.mixed_linear.out, E.mixed_linear_out, (x, weight, scales, None, torch.float16),
             torch.empty(5, 13, dtype=torch.float16))


def test_four_bit_weights_are_high_nibble_first_and_offset_by_eight() -> None:
    weight = torch.tensor([[0x1F, 0x80]], dtype=torch.uint8)  # values 1-8, 15-8, 8-8, 0-8
    out = torch.empty(0)
    E.embedding_4bit_out(weight, torch.ones(1), None, -8, 7, torch.tensor([0]), out=out)
    assert out.tolist() == [[-7.0, 7.0, 0.0, -8.0]]
    weight = torch.tensor([[0b11_10_01_00]], dtype=torch.uint8)  # lowest bits first
    E.embedding_2bit_out(weight, torch.ones(1), None, -2, 1, torch.tensor([0]), out=out)
    assert out.tolist() == [[-2.0, -1.0, 0.0, 1.0]]


EMBEDDINGS = [(8, "embedding_byte", torch.uint8), (8, "embedding_byte", torch.int8),
              (4, "embedding_4bit", torch.uint8), (2, "embedding_2bit", torch.uint8)]


@pytest.mark.parametrize(("bits", "op", "weight_dtype"), EMBEDDINGS)
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("groups", [None, 1, 4])
def test_embeddings_are_executorchs_references(et_references: Any, bits: int, op: str,
                                               weight_dtype: torch.dtype,
                                               scale_dtype: torch.dtype,
                                               groups: int | None) -> None:
    generator = torch.Generator().manual_seed(6)
    low, high = {8: (-128, 127), 4: (-8, 7), 2: (-2, 1)}[bits]
    bounds = (-128, 128) if weight_dtype == torch.int8 else (0, 256)
    weight = torch.randint(*bounds, (10, 2 * bits), generator=generator).to(weight_dtype)
    shape = (10,) if groups is None else (10, groups)
    scales = (torch.rand(shape, generator=generator) * 0.1).to(scale_dtype)
    zeros = torch.randint(-3, 3, shape, generator=generator).to(scale_dtype)
    indices = torch.tensor([[0, 3, 9], [2, 2, 7]])
    reference = getattr(et_references, op)
    for zero_points in (None, zeros):
        args = (weight, scales, zero_points, low, high, indices)
        out = torch.empty(0, dtype=scale_dtype)
        getattr(E, f"{op}_out")(*args, out=out)
        same(out, reference.default(*args))
        for dtype in (torch.float32, torch.float16):
            if zero_points is not None and dtype != scale_dtype:
                continue  # ExecuTorch wants zero points in the output dtype
            out = torch.empty(0, dtype=dtype)
            getattr(E, f"{op}_dtype_out")(*args, dtype, out=out)
            expected = reference.dtype(*args, dtype=dtype)
            if scale_dtype == torch.float16 and dtype == torch.float32:
                # The reference multiplies in float16; ExecuTorch's C++ in float32.
                torch.testing.assert_close(out, expected, rtol=2 ** -10, atol=0)
                rows = E.unpack(weight[indices.reshape(-1)], bits).float()
                per_column = scales.float().reshape(10, -1)[indices.reshape(-1)]
                per_column = per_column.repeat_interleave(rows.shape[1] // per_column.shape[1],
                                                          dim=1)
                same(out, (rows * per_column).reshape(out.shape))
            else:
                same(out, expected)
