"""`--quantize int8 --target xnnpack` where a quantized operator reads what is not
a runtime activation: a constant Edge folded (a position embedding of
`arange`), and a weight stored [in, out] (a GPT-2 `Conv1D`'s addmm).

The quantizer quantizes both inputs of an add; when one is a constant, Edge
folds it and the partition holds `Q(constant)`, which the lowering folds to
integers. Those must reach XNNPACK as a qint8 constant with the quantize's
parameters (they once became an fp32 constant of integer values, which the
load check refused). A per-channel weight read [in, out] is the transpose of
XNNPACK's [out, in] filter; it once stayed outside the delegate, dequantized
by a portable kernel at every call. Either way the file needs no kernel
outside its delegates, and runs on ExecuTorch without its quantized library.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.fx import GraphModule

from exirc.compiler import CompileOptions, CompileResult, compile_module
from exirc.inspector.delegates import program_payloads
from exirc.serialize import deserialize
from exirc.serialize.xnnpack import graph as G
from tests.executorch_without_quantized import run_executorch_without_quantized_kernels
from tests.oracle import requires_executorch
from tests.quantize.test_zoo_quantized import assert_within_steps, output_steps, run_exirc

pytestmark = pytest.mark.skipif(
    __import__("importlib").util.find_spec("torchao") is None, reason="needs torchao")


class PositionSum(nn.Module):
    """linear(x) + a position embedding of arange (constant once folded): the
    quantized add is the output, so XNNPACK's fixed-point rescaling is one step
    from eager (a layer after it could magnify that step)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.positions = nn.Embedding(6, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x) + self.positions(torch.arange(x.shape[0])))


class InOutWeight(nn.Module):
    """addmm(bias, x, w) with w stored [in, out], as transformers' Conv1D."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 24) * 0.2)
        self.bias = nn.Parameter(torch.randn(24) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.addmm(self.bias, x, self.weight))


MODELS = {"position_sum": PositionSum, "in_out_weight": InOutWeight}


def _inputs(seed: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(6, 16, generator=torch.Generator().manual_seed(seed)),)


@functools.cache
def _compile(name: str) -> tuple[CompileResult, GraphModule]:
    """The xnnpack file and the quantized reference (what --verify runs), made once for
    the module's tests (which only read them)."""
    from exirc.capture import MethodSource, capture
    from exirc.diagnostics.quantization import quantize_sources
    from exirc.quantize import QuantizeConfig

    torch.manual_seed(0)
    model = MODELS[name]().eval()
    result = compile_module(model, _inputs(0), options=CompileOptions(
        target="xnnpack", quantize="int8", min_sqnr_db=0.0))
    sources = {"forward": MethodSource("forward", model, _inputs(0), None, None, "<module>")}
    quantized = quantize_sources(sources, {"forward": capture(sources["forward"])},
                                 QuantizeConfig("int8"), ())
    reference = quantized.sources["forward"].module
    assert isinstance(reference, GraphModule)
    return result, reference


def _operators(result: CompileResult) -> set[str]:
    return {op.name for plan in result.program.execution_plan for op in plan.operators}


def _nodes(result: CompileResult) -> list[tuple[G.Node, dict[int, G.TensorValue]]]:
    blobs = [p.blob for p in program_payloads(deserialize(result.data)) if p.blob is not None]
    return [(node, {v.id_out: v for v in blob.graph.values})
            for blob in blobs for node in blob.graph.nodes]


def test_a_folded_constant_meets_a_quantized_add_as_a_qint8_constant() -> None:
    result, _ = _compile("position_sum")
    assert _operators(result) == set(), "every operator runs in the delegate"
    adds = [(n, values) for n, values in _nodes(result) if n.kind == G.NodeKind.ADD]
    assert len(adds) == 1
    node, values = adds[0]
    assert isinstance(node.params, G.Node2x1)
    operands = [values[node.params.input1_id], values[node.params.input2_id]]
    assert all(v.datatype == G.Datatype.QINT8 for v in operands), operands
    assert sum(bool(v.constant_buffer_idx) for v in operands) == 1, operands


def test_a_weight_stored_in_out_becomes_a_quantized_fully_connected() -> None:
    result, _ = _compile("in_out_weight")
    assert _operators(result) == set(), "the weight is not dequantized outside the delegate"
    (node, values), = [(n, v) for n, v in _nodes(result)
                       if n.kind == G.NodeKind.FULLY_CONNECTED]
    assert isinstance(node.params, G.FullyConnected)
    weight = values[node.params.filter_id]
    assert weight.datatype == G.Datatype.QCINT8 and weight.dims == [24, 16]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_file_equals_the_quantized_reference(name: str) -> None:
    result, reference = _compile(name)
    steps = output_steps(reference)
    for seed in (0, 5):
        with torch.no_grad():
            expected = [reference(*_inputs(seed))]
        assert_within_steps(run_exirc(result.data, _inputs(seed)), expected, steps, name)


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_file_runs_on_executorch_without_its_quantized_kernels(
        name: str, tmp_path: Path) -> None:
    result, reference = _compile(name)
    inputs = _inputs(5)
    theirs = run_executorch_without_quantized_kernels(result.data, inputs, tmp_path)
    assert_within_steps(theirs, run_exirc(result.data, inputs), output_steps(reference), name)
