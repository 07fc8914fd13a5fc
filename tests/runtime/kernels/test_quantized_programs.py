"""ExecuTorch's quantized programs run in exirc's runtime with ExecuTorch's results.

The programs are made here, by ExecuTorch, without delegation: a conv +
linear + add model quantized with torchao's PT2E and the XNNPACK quantizer
(Q/DQ on the quantized kernels, float ops on the portable ones), the same
with uint8 activations through ExecuTorch's QuantFusionPass (which makes
`quantized_decomposed::add`), quantized embeddings, and dynamic per-token and
per-tensor quantization (choose_qparams). ExecuTorch's runtime runs them with
its quantized kernel library loaded.

Float outputs may differ by at most one quantization step (a float op of
ExecuTorch's portable library and torch's can round a value to the other
side of a tie); so far they are equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from exirc.runtime import load
from exirc.runtime.errors import ExecutionError
from tests.oracle import requires_executorch
from tests.pattern_traces import trace_patterns_once

pytestmark = [requires_executorch, pytest.mark.oracle]


@pytest.fixture(scope="module")
def executorch_runtime() -> Any:
    """ExecuTorch's runtime, with its quantized kernels registered."""
    import executorch.exir.passes._quant_patterns_and_replacements  # noqa: F401
    import executorch.kernels.quantized  # noqa: F401
    import torch.ao.quantization.fx._decomposed  # noqa: F401
    from executorch.runtime import Runtime

    return Runtime.get()


def run_both(runtime: Any, pte: bytes, inputs: Sequence[torch.Tensor]) -> tuple[list[Any], ...]:
    program = runtime.load_program(pte)  # alive while its method runs
    theirs = program.load_method("forward").execute([t.clone() for t in inputs])
    ours = load(pte).run("forward", [t.clone() for t in inputs])
    return [t.clone() for t in theirs], ours


def operators(program: Any) -> set[str]:
    return {f"{op.name}.{op.overload}" for op in program.execution_plan[0].operators}


def assert_within_one_step(ours: Sequence[torch.Tensor], theirs: Sequence[torch.Tensor]) -> None:
    """Equal integers; floats within one step of the quantization grid they lie on."""
    assert len(ours) == len(theirs)
    for mine, other in zip(ours, theirs):
        assert mine.dtype == other.dtype and mine.shape == other.shape
        if not mine.dtype.is_floating_point or torch.equal(mine, other):
            assert torch.equal(mine, other)
            continue
        grid = other.flatten().unique()
        step = (grid[1:] - grid[:-1]).min()
        assert (mine - other).abs().max() <= step * 1.001


class ConvLinearAdd(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.conv(x).relu().flatten(2)
        return self.fc(h) + h + y


def pt2e_program(per_channel: bool, uint8_fused: bool) -> tuple[Any, tuple[torch.Tensor, ...]]:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import EdgeCompileConfig, to_edge
    from executorch.exir.passes.quant_fusion_pass import QuantFusionPass
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    model = ConvLinearAdd().eval()
    generator = torch.Generator().manual_seed(1)
    inputs = (torch.randn(1, 3, 4, 4, generator=generator),
              torch.randn(1, 4, 16, generator=generator))
    config = get_symmetric_quantization_config(is_per_channel=per_channel)
    if uint8_fused:  # ExecuTorch's quantized add takes uint8 ranges only
        activation = dataclasses.replace(config.input_activation, dtype=torch.uint8,
                                         quant_min=0, quant_max=255)
        config = dataclasses.replace(config, input_activation=activation,
                                     output_activation=activation)
    trace_patterns_once()
    prepared = prepare_pt2e(torch.export.export(model, inputs).module(),
                            XNNPACKQuantizer().set_global(config))
    prepared(*inputs)  # calibration
    exported = torch.export.export(convert_pt2e(prepared), inputs)
    edge = to_edge(exported, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    if uint8_fused:
        edge = edge.transform([QuantFusionPass(_fix_node_meta_val=True)])
    return edge.to_executorch(), inputs


@pytest.mark.parametrize(("per_channel", "uint8_fused"), [
    pytest.param(True, False, id="per_channel_weights"),
    pytest.param(False, False, id="per_tensor_weights", marks=pytest.mark.slow),
    pytest.param(False, True, id="uint8_quant_fusion"),
])
def test_pt2e_quantized_program_matches_executorch(executorch_runtime: Any, per_channel: bool,
                                                   uint8_fused: bool) -> None:
    manager, inputs = pt2e_program(per_channel, uint8_fused)
    used = operators(manager.executorch_program)
    assert "quantized_decomposed::quantize_per_tensor.out" in used
    assert ("quantized_decomposed::dequantize_per_channel.out" in used) == per_channel
    assert ("quantized_decomposed::add.out" in used) == uint8_fused
    pte = bytes(manager.buffer)
    theirs, ours = run_both(executorch_runtime, pte, inputs)
    assert_within_one_step(ours, theirs)
    assert_within_one_step(load(pte).run("forward", list(inputs)), ours)  # a second run


class Embeddings(torch.nn.Module):
    """Every embedding kind: 8-, 4- and 2-bit, per row and per group, with and
    without zero points, float32 and float16 parameters and outputs."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)

        def ints(low: int, high: int, *shape: int) -> torch.Tensor:
            return torch.randint(low, high, shape, generator=generator)

        self.register_buffer("w8", ints(-128, 128, 10, 8).to(torch.int8))
        self.register_buffer("s8", torch.rand(10, 2, generator=generator) * 0.1)
        self.register_buffer("z8", ints(-5, 5, 10, 2).float())
        self.register_buffer("w4", ints(0, 256, 10, 4).to(torch.uint8))
        self.register_buffer("s4", torch.rand(10, generator=generator) * 0.1)
        self.register_buffer("w2", ints(0, 256, 10, 2).to(torch.uint8))
        self.register_buffer("s2", (torch.rand(10, 4, generator=generator) * 0.1).half())
        self.register_buffer("z2", ints(-2, 2, 10, 4).half())

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q = torch.ops.quantized_decomposed
        return (q.embedding_byte.default(self.w8, self.s8, self.z8, -128, 127, ids),
                q.embedding_byte.dtype(self.w8, self.s8, None, -128, 127, ids,
                                       dtype=torch.float16),
                q.embedding_4bit.default(self.w4, self.s4, None, -8, 7, ids),
                q.embedding_4bit.dtype(self.w4, self.s4.half(), None, -8, 7, ids,
                                       dtype=torch.float32),
                q.embedding_2bit.dtype(self.w2, self.s2, self.z2, -2, 1, ids,
                                       dtype=torch.float16))


class SubByteEmbeddings(Embeddings):
    """The 4- and 2-bit ones, which also take int32 indices (the 8-bit one does not)."""

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return super().forward(ids)[2:]


class Dynamic(torch.nn.Module):
    """Parameters chosen at run time: per token, and per tensor (the Tensor_out ops)."""

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q = torch.ops.quantized_decomposed
        scales, zeros = q.choose_qparams_per_token_asymmetric.default(x, torch.int8)
        tokens = q.quantize_per_token.default(x, scales, zeros, -128, 127, torch.int8)
        a = q.dequantize_per_token.default(tokens, scales, zeros, -128, 127, torch.int8,
                                           torch.float32)
        scale, zero = q.choose_qparams.tensor(w, 0, 255, 1e-7, torch.uint8)
        quantized = q.quantize_per_tensor.tensor(w, scale, zero, 0, 255, torch.uint8)
        b = q.dequantize_per_tensor.tensor(quantized, scale, zero, 0, 255, torch.uint8)
        return a, b, tokens, scales, zeros, quantized, scale, zero


def edge_program(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Any:
    from executorch.exir import EdgeCompileConfig, to_edge

    exported = torch.export.export(module, inputs)
    edge = to_edge(exported, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    return edge.to_executorch()


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
def test_quantized_embeddings_match_executorch(executorch_runtime: Any,
                                               index_dtype: torch.dtype) -> None:
    module = Embeddings() if index_dtype == torch.int64 else SubByteEmbeddings()
    ids = torch.tensor([[0, 3, 9], [2, 2, 7]], dtype=index_dtype)
    manager = edge_program(module, (ids,))
    assert {f"quantized_decomposed::embedding_{kind}" for kind in ("4bit.out", "4bit.dtype_out",
            "2bit.dtype_out")} <= operators(manager.executorch_program)
    theirs, ours = run_both(executorch_runtime, bytes(manager.buffer), (ids,))
    assert_within_one_step(ours, theirs)
    for mine, other in zip(ours, theirs):
        assert torch.equal(mine, other)  # no float op before them: exact


def test_dynamic_quantization_matches_executorch(executorch_runtime: Any) -> None:
    generator = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 2, 16, generator=generator), torch.randn(4, 5, generator=generator)
    manager = edge_program(Dynamic(), (x, w))
    assert {"quantized_decomposed::choose_qparams.Tensor_out",
            "quantized_decomposed::choose_qparams_per_token_asymmetric.out",
            "quantized_decomposed::quantize_per_tensor.Tensor_out",
            "quantized_decomposed::dequantize_per_token.out"} <= operators(
                manager.executorch_program)
    theirs, ours = run_both(executorch_runtime, bytes(manager.buffer), (x, w))
    for mine, other in zip(ours, theirs):
        assert mine.dtype == other.dtype and torch.equal(mine, other)


def test_an_index_out_of_range_is_an_execution_error(executorch_runtime: Any) -> None:
    """ExecuTorch's 4-bit embedding would read past its weight; exirc stops."""
    ids = torch.tensor([[0, 3, 9]], dtype=torch.int32)
    program = load(bytes(edge_program(SubByteEmbeddings(), (ids,)).buffer))
    with pytest.raises(ExecutionError, match=r"embedding_4bit.out: index 10 is out of range "
                                             r"for 10 rows") as raised:
        program.run("forward", [torch.tensor([[0, 3, 10]], dtype=torch.int32)])
    assert raised.value.exit_code == 3
    # The message says which instruction of which method refused.
    assert raised.value.message.startswith("while executing instruction")
    assert "of method 'forward'" in raised.value.message
