"""pt2e-quantized models on `--target xnnpack`: their DQ -> op -> Q groups become XNNPACK's
quantized nodes; the files run on ExecuTorch's runtime as on exirc's, within one
quantization step of the convert_pt2e module run in eager; and they leave fewer kernel
calls on portable than before (and no more than ExecuTorch's own lowering).

One step is the output's scale: XNNPACK adds an int32 bias rounded at compile time
and rescales once per node where PyTorch rounds in float, so a result may land on the
neighbouring integer. Its quantized global average pooling also rounds after adding
the zero point, so ExecuTorch's runtime can differ from exirc's by a step at ties.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from collections import Counter
from typing import Any

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines the Q/DQ ops)
from torch import nn

from exirc.compiler import CompileOptions, CompileResult, compile_module
from exirc.inspector.delegates import program_payloads
from exirc.serialize import deserialize
from exirc.serialize import program as P
from exirc.serialize.xnnpack import graph as G
from tests.backend.xnnpack.quantized_models import CASES, output_scales, quantize
from tests.oracle import requires_executorch

pytestmark = [requires_executorch, pytest.mark.oracle,
              pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                 reason="needs torchao (pt2e quantization)")]

K = G.NodeKind
QD = torch.ops.quantized_decomposed
GEMMS = (K.CONV2D, K.DEPTHWISE_CONV2D, K.FULLY_CONNECTED)
# The quantized nodes each model must become (at least these, all on qint8 values).
QUANTIZED = {
    "mlp": {K.FULLY_CONNECTED: 3},
    "cnn": {K.CONV2D: 2, K.MAX_POOLING_2D: 2, K.FULLY_CONNECTED: 1},
    "mobilenet_block": {K.CONV2D: 2, K.DEPTHWISE_CONV2D: 1, K.ADD: 1,
                        K.GLOBAL_AVG_POOLING_2D: 1, K.FULLY_CONNECTED: 1},
    "transformer_block": {K.FULLY_CONNECTED: 6, K.ADD: 2},
}


@dataclasses.dataclass
class Compiled:
    model: torch.fx.GraphModule   # the convert_pt2e module: the reference
    inputs: tuple[torch.Tensor, ...]
    result: CompileResult

    @functools.cached_property
    def blobs(self) -> list[G.XnnpackBlob]:
        payloads = program_payloads(deserialize(self.result.data))
        return [p.blob for p in payloads if p.blob is not None]


def compile_xnnpack(model: nn.Module | torch.fx.GraphModule,
                    inputs: tuple[torch.Tensor, ...]) -> CompileResult:
    return compile_module(model, inputs, options=CompileOptions(target="xnnpack"))


@functools.cache
def compiled(name: str) -> Compiled:
    torch.manual_seed(0)
    case = CASES[name]
    model, inputs = case.make(), case.inputs()
    quantized = quantize(model, inputs)
    return Compiled(quantized, inputs, compile_xnnpack(quantized, inputs))


def kernel_calls(data: bytes) -> list[str]:
    plan = deserialize(data).execution_plan[0]
    return [plan.operators[i.op_index].name for chain in plan.chains
            for i in chain.instructions if isinstance(i, P.KernelCall)]


def run_executorch(data: bytes, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    import executorch.kernels.quantized  # noqa: F401  (the Q/DQ kernels left on portable)
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(data)  # kept alive while its method runs
    outputs = program.load_method("forward").execute([t.clone() for t in inputs])
    return [o.clone() for o in outputs]


def run_exirc(data: bytes, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    from exirc.runtime import load

    return [torch.as_tensor(o) for o in load(data).run("forward", [t.clone() for t in inputs])]


def eager(model: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def steps(a: torch.Tensor, b: torch.Tensor, scale: float) -> float:
    """The largest difference, in quantization steps (a hair over 1 is float noise)."""
    return float((a - b).abs().max()) / scale


def values_by_id(blob: G.XnnpackBlob) -> dict[int, G.TensorValue]:
    return {v.id_out: v for v in blob.graph.values}


@pytest.mark.parametrize("name", sorted(CASES))
def test_quantized_groups_become_quantized_nodes(name: str) -> None:
    low = compiled(name)
    report = low.result.delegation["forward"]
    assert report.delegated_nodes == report.compute_nodes, report.left_out
    found: Counter[G.NodeKind] = Counter()
    for blob in low.blobs:
        values = values_by_id(blob)
        for node in blob.graph.nodes:
            ids = [getattr(node.params, f.name) for f in dataclasses.fields(node.params)
                   if f.name.endswith("_id") and getattr(node.params, f.name)
                   != G.INVALID_VALUE_ID]
            if node.kind in QUANTIZED[name] and values[ids[-1]].datatype == G.Datatype.QINT8:
                found[node.kind] += 1
            if node.kind not in GEMMS:
                continue
            p = node.params
            assert isinstance(p, (G.Conv, G.FullyConnected))
            activation, weight, out = values[p.input1_id], values[p.filter_id], values[p.output_id]
            for value in (activation, out):
                assert value.datatype == G.Datatype.QINT8
                assert isinstance(value.quant, G.PerTensorQuant)
            assert weight.datatype == G.Datatype.QCINT8 and weight.constant_buffer_idx
            assert isinstance(weight.quant, G.PerChannelQuant)
            assert weight.quant.scale_buffer_idx  # the scales in named data, as ExecuTorch
            channels = weight.dims[weight.quant.channel_dim]
            assert weight.quant.num_scales == channels
            assert blob.graph.constant_data[weight.quant.scale_buffer_idx].named_key \
                .startswith("scale_")
            bias = values[p.bias_id]
            assert bias.datatype == G.Datatype.QCINT32 and bias.dims == [channels]
    for kind, count in QUANTIZED[name].items():
        assert found[kind] >= count, f"{kind.name}: {found[kind]} quantized, expected {count}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_executorch_and_exirc_agree_within_a_step_of_eager(name: str) -> None:
    low = compiled(name)
    theirs = run_executorch(low.result.data, low.inputs)
    ours = run_exirc(low.result.data, low.inputs)
    reference = eager(low.model, low.inputs)
    scales = output_scales(low.model)
    assert len(theirs) == len(ours) == len(reference) == len(scales)
    for i, (a, b, want, scale) in enumerate(zip(theirs, ours, reference, scales)):
        assert a.shape == b.shape == want.shape
        assert steps(a, b, scale) <= 1.001, f"output {i}: ExecuTorch's runtime vs exirc's"
        assert steps(a, want, scale) <= 1.001, f"output {i}: ExecuTorch's runtime vs eager"
        assert steps(b, want, scale) <= 1.001, f"output {i}: exirc's runtime vs eager"


@pytest.mark.parametrize("name", sorted(CASES))
def test_fewer_kernel_calls_than_before_and_no_more_than_executorch(name: str) -> None:
    calls = kernel_calls(compiled(name).result.data)
    case = CASES[name]
    assert len(calls) < case.before
    assert len(calls) <= case.executorch.kernel_calls, calls


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_executorch_reference_is_current(name: str) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    low = compiled(name)
    lowered = to_edge_transform_and_lower(torch.export.export(low.model, low.inputs),
                                          partitioner=[XnnpackPartitioner()])
    data = bytes(lowered.to_executorch().buffer)
    nodes = sum(len(p.blob.graph.nodes) for p in program_payloads(deserialize(data))
                if p.blob is not None)
    assert (len(kernel_calls(data)), nodes) == (CASES[name].executorch.kernel_calls,
                                                CASES[name].executorch.nodes)


def test_a_clamp_xnnpack_would_fuse_runs_in_float_between_converts() -> None:
    """fc2 -> Q -> DQ -> relu6 -> Q with two quantizations: as a qint8 Clamp, XNNPACK's
    runtime would fuse it into the fully connected node and round once where PyTorch
    rounds twice, which can land output_scale / input_scale steps away (ExecuTorch's own
    files are 2 steps off eager on a MobileNet block)."""
    low = compiled("mlp")
    (blob,) = low.blobs
    values = values_by_id(blob)
    producers = {n.params.output_id: n for n in blob.graph.nodes
                 if isinstance(n.params, G.Node1x1)}
    (clamp,) = [n for n in blob.graph.nodes if n.kind == K.CLAMP]
    assert isinstance(clamp.params, G.Node1x1) and clamp.output_min_max == (0.0, 6.0)
    assert values[clamp.params.input_id].datatype == G.Datatype.FP32
    assert producers[clamp.params.input_id].kind == K.CONVERT
    (scale,) = output_scales(low.model)
    for outputs in (run_exirc(low.result.data, low.inputs),
                    run_executorch(low.result.data, low.inputs)):
        assert steps(outputs[0], eager(low.model, low.inputs)[0], scale) <= 1.001


class Hole(nn.Module):
    """cumsum (no XNNPACK operator) between two linears: a's quantized result goes
    to both sides of it, so two delegates read its integers."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return self.c(y) + torch.cumsum(self.b(y), -1)


def test_a_qint8_tensor_crosses_delegates_where_the_graph_forces_it() -> None:
    torch.manual_seed(0)
    inputs = (torch.randn(4, 8, generator=torch.Generator().manual_seed(1)),)
    model = quantize(Hole(), inputs)
    low = Compiled(model, inputs, compile_xnnpack(model, inputs))
    assert kernel_calls(low.result.data) == ["aten::cumsum"]  # as ExecuTorch's lowering
    first, second = low.blobs
    outputs = [v for v in first.graph.values if v.flags & G.FLAG_EXTERNAL_OUTPUT]
    inputs_ = [v for v in second.graph.values if v.flags & G.FLAG_EXTERNAL_INPUT]
    assert G.Datatype.QINT8 in {v.datatype for v in outputs}
    assert G.Datatype.QINT8 in {v.datatype for v in inputs_}
    (scale,) = output_scales(model)
    reference = eager(model, inputs)[0]
    assert steps(run_exirc(low.result.data, inputs)[0], reference, scale) <= 1.001
    assert steps(run_executorch(low.result.data, inputs)[0], reference, scale) <= 1.001


class HandQuantized(nn.Module):
    """Q/DQ written by hand: a convolution and a linear layer with int8 weights whose
    results are not quantized again, and a quantize to a narrow range."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(3)
        self.register_buffer("conv_w", torch.randint(-127, 128, (4, 3, 3, 3), dtype=torch.int8,
                                                     generator=generator))
        self.register_buffer("fc_w", torch.randint(-127, 128, (5, 8), dtype=torch.int8,
                                                   generator=generator))
        self.register_buffer("conv_s", torch.full((4,), 0.01))
        self.register_buffer("fc_s", torch.full((5,), 0.02))
        self.register_buffer("conv_z", torch.zeros(4, dtype=torch.int64))
        self.register_buffer("fc_z", torch.zeros(5, dtype=torch.int64))

    def forward(self, x: torch.Tensor, v: torch.Tensor) -> Any:
        q = QD.quantize_per_tensor(x, 0.05, 3, -128, 127, torch.int8)
        w = QD.dequantize_per_channel(self.conv_w, self.conv_s, self.conv_z, 0, -127, 127,
                                      torch.int8)
        conv = torch.nn.functional.conv2d(
            QD.dequantize_per_tensor(q, 0.05, 3, -128, 127, torch.int8), w)
        narrow = QD.quantize_per_tensor(v, 0.05, 0, -127, 127, torch.int8)
        fc_w = QD.dequantize_per_channel(self.fc_w, self.fc_s, self.fc_z, 0, -127, 127,
                                         torch.int8)
        linear = torch.nn.functional.linear(
            QD.dequantize_per_tensor(narrow, 0.05, 0, -127, 127, torch.int8), fc_w)
        return conv, linear


def test_what_cannot_run_quantized_exactly_is_left_out_with_its_reason() -> None:
    inputs = (torch.randn(1, 3, 6, 6), torch.randn(2, 8))
    result = compile_xnnpack(HandQuantized().eval(), inputs)
    left = {x.op: (x.category, x.reason) for x in result.delegation["forward"].left_out}
    assert left["convolution"] == (
        "constraint", "its weight is quantized, but it cannot run as a quantized XNNPACK "
                      "node: its result goes to output, not to a quantize")
    assert left["quantized_decomposed::quantize_per_tensor"] == (
        "dtype", "quantize_per_tensor_1 clamps to [-127, 127]; XNNPACK saturates qint8 to "
                 "[-128, 127] only")
    # The linear layer runs in float32 on the weight dequantized outside, as before.
    assert "addmm" not in left and "mm" not in left
    category, reason = left["quantized_decomposed::dequantize_per_channel"]
    assert reason.startswith("a quantized weight goes with")
    # Dequantizing integers clamped to a narrow range is exact: taken (a Convert).
    assert "quantized_decomposed::dequantize_per_tensor" not in left
    model = HandQuantized().eval()
    for got, want in zip(run_exirc(result.data, inputs), eager(model, inputs)):  # type: ignore
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
