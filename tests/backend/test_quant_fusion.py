"""QuantFusion and the weight-only tables it reads: the fused ops compute what the
patterns they replace compute, and the packed tables are ExecuTorch's layout."""

from __future__ import annotations

import pytest
import torch

from exirc.backend.quant_fusion import PATTERNS, QuantFusion
from exirc.backend.quantized_ops import (
    EMBEDDING_OPS,
    dequantize_rows,
    out_forms,
    pack_nibbles,
    unpack_nibbles,
)
from exirc.compiler import CompileOptions, compile_module
from exirc.errors import UsageError
from exirc.quantize.weight_only import group_size_for, quantize_rows
from exirc.serialize import deserialize
from tests.oracle import requires_executorch


def _operators(data: bytes) -> set[str]:
    program = deserialize(data)
    return {f"{op.name}.{op.overload}" if op.overload else op.name
            for plan in program.execution_plan for op in plan.operators}


@pytest.mark.parametrize("bits", [4, 2])
def test_packing_round_trips_every_value(bits: int) -> None:
    low = -(1 << (bits - 1))
    values = torch.arange(low, -low, dtype=torch.int8).repeat(3, 4)
    packed = pack_nibbles(values, bits)
    assert packed.dtype == torch.uint8 and packed.shape[1] * (8 // bits) == values.shape[1]
    assert torch.equal(unpack_nibbles(packed, bits), values)


@requires_executorch
@pytest.mark.parametrize("bits", [8, 4, 2])
def test_embedding_ops_match_executorchs_python_reference(bits: int) -> None:
    """The nibble order and offset of the packed tables are ExecuTorch's."""
    import executorch.exir.passes._quant_patterns_and_replacements  # noqa: F401

    torch.manual_seed(0)
    low, high = {8: (-128, 127), 4: (-8, 7), 2: (-2, 1)}[bits]
    values = torch.randint(low, high + 1, (6, 16), dtype=torch.int8)
    table = values if bits == 8 else pack_nibbles(values, bits)
    scales = torch.rand(6, 4) + 0.1  # group-wise: 4 groups of 4
    indices = torch.tensor([[0, 5, 2], [3, 3, 1]])
    name = "embedding_byte" if bits == 8 else f"embedding_{bits}bit"
    reference = getattr(torch.ops.quantized_decomposed, name)(
        table, scales, None, low, high, indices)
    ours = EMBEDDING_OPS[bits](table, scales, None, low, high, indices)
    torch.testing.assert_close(ours, reference, rtol=0, atol=0)
    assert torch.equal(ours[0, 1], dequantize_rows(values, scales, None)[5])


def test_quantize_rows_is_symmetric_and_within_one_step() -> None:
    torch.manual_seed(0)
    weight = torch.randn(8, 64)
    values, scales = quantize_rows(weight, 4, 16)
    assert values.dtype == torch.int8 and scales.shape == (8, 4)
    assert int(values.min()) >= -8 and int(values.max()) <= 7
    restored = dequantize_rows(values, scales, None)
    step = scales.repeat_interleave(16, dim=1)
    assert bool(((restored - weight).abs() <= step / 2 + 1e-6).all())


def test_group_size_falls_back_to_whole_rows() -> None:
    assert group_size_for(256, 4, None) == 128
    assert group_size_for(64, 4, None) == 64  # the default group is wider than the row
    assert group_size_for(96, 4, 64) == 96  # 64 does not divide 96
    assert group_size_for(96, 8, None) == 96  # int8: per channel


def test_every_q_dq_op_has_executorchs_out_form() -> None:
    names = {repr(form) for form in out_forms().values()}
    assert {"quantized_decomposed::quantize_per_tensor.out",
            "quantized_decomposed::dequantize_per_tensor.out",
            "quantized_decomposed::dequantize_per_channel.out",
            "quantized_decomposed::quantize_per_tensor.Tensor_out"} <= names


def test_unknown_pattern_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown quant_fusion pattern"):
        QuantFusion(patterns=("nope",)).run(None)  # type: ignore[arg-type]
    assert list(PATTERNS) == ["symmetric", "embedding", "dequantized_weight", "add"]


class _Embedder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Embedding(50, 64)
        self.head = torch.nn.Linear(64, 50, bias=False)
        self.head.weight = self.table.weight  # tied, as language models do

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(ids))


@pytest.mark.parametrize("mode, kernel", [
    ("int8-weight-only", "quantized_decomposed::embedding_byte.out"),
    ("int4-weight-only", "quantized_decomposed::embedding_4bit.out")])
def test_weight_only_tables_are_read_through_executorchs_embedding_kernels(
        mode: str, kernel: str) -> None:
    ids = torch.tensor([[1, 7, 49]])
    result = compile_module(_Embedder().eval(), (ids,), options=CompileOptions(quantize=mode))
    operators = _operators(result.data)
    assert kernel in operators
    assert not any("dequantize_per_channel_group" in op for op in operators)
    report = result.quantization
    # The tied weight is one table: the lookup and the head read the same rows.
    assert report is not None and len(report.weights) == 1
    assert report.weights[0].users == ["embedding", "linear"]
    table_bytes = 50 * 64 // (2 if mode.startswith("int4") else 1)
    assert report.weight_bytes < table_bytes + 1024
    assert report.accuracy and report.accuracy[0].sqnr_db > 10


class _AsymmetricTable(torch.nn.Module):
    """An embedding of a per-row asymmetric int8 table, as pt2e writes one: int64
    zero points, which the embedding kernels would read as floats."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.register_buffer("table", torch.randint(-128, 128, (20, 8), dtype=torch.int8))
        self.register_buffer("scales", torch.rand(20) + 0.01)
        self.register_buffer("zero_points", torch.randint(-5, 5, (20,)))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        table = torch.ops.quantized_decomposed.dequantize_per_channel(
            self.table, self.scales, self.zero_points, 0, -128, 127, torch.int8)
        return torch.nn.functional.embedding(ids, table)


def test_int64_zero_points_are_not_fused_into_an_embedding_kernel() -> None:
    out_forms()  # defines the per-channel ops
    model, ids = _AsymmetricTable(), torch.tensor([[0, 19, 7]])
    result = compile_module(model, (ids,))
    operators = _operators(result.data)
    assert "quantized_decomposed::embedding_byte.out" not in operators
    assert "quantized_decomposed::dequantize_per_channel.out" in operators
    from exirc.runtime import load

    got = load(result.data).run("forward", [ids])[0]
    torch.testing.assert_close(got, model(ids), rtol=0, atol=0)
