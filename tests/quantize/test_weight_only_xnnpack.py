"""Weight-only quantization on --target xnnpack: linear layers run in XNNPACK with
their integer weights, or are refused.

A weight-only linear with weights per output channel becomes a FullyConnected of
its float input with a qcint8 / qcint4 filter (XNNPACK's f32-qc8w / f32-qc4w
GEMMs), which ExecuTorch 1.5.1's runtime runs without its quantized kernels; one
with grouped weights (which would be dequantized on portable kernels on every
call) is refused with TargetQuantizationError. Checked against the weight-only
model run in eager.
"""

from __future__ import annotations

from typing import Any

import pytest
from torch.fx import GraphModule

from exirc.compiler import CompileOptions, CompileResult, compile_module
from exirc.errors import TargetQuantizationError
from exirc.quantize import QuantizeConfig
from tests.executorch_without_quantized import run_executorch_without_quantized_kernels
from tests.oracle import requires_executorch
from tests.quantize.test_dynamic_quant import _inputs, _model, _payload_graph
from tests.quantize.test_zoo_quantized import _eager, assert_float_rounding, run_exirc

MODES = ("int8-weight-only", "int4-weight-only")  # per channel: the layers have <= 128 inputs


def _reference(mode: str) -> GraphModule:
    from exirc.capture import MethodSource, capture
    from exirc.diagnostics.quantization import quantize_sources

    source = MethodSource("forward", _model(), _inputs(0), None, None, "<module>")
    quantized = quantize_sources({"forward": source}, {"forward": capture(source)},
                                 QuantizeConfig(mode), ())
    module = quantized.sources["forward"].module
    assert isinstance(module, GraphModule)
    return module


_compiled: dict[str, CompileResult] = {}


def _compile(mode: str) -> CompileResult:
    if mode not in _compiled:
        _compiled[mode] = compile_module(_model(), _inputs(0),
                                         options=CompileOptions(target="xnnpack", quantize=mode))
    return _compiled[mode]


@pytest.mark.parametrize("mode", MODES)
def test_linears_read_float_inputs_with_integer_filters_inside_xnnpack(mode: str) -> None:
    from exirc.serialize.reader import deserialize
    from exirc.serialize.xnnpack import graph as G

    result = _compile(mode)
    operators = {o.name for o in deserialize(result.data).execution_plan[0].operators}
    assert not any(name.startswith("quantized_decomposed") for name in operators), operators
    graph = _payload_graph(result.data)
    connected = [n for n in graph.nodes if n.kind == G.NodeKind.FULLY_CONNECTED]
    assert len(connected) == 2
    for node in connected:
        assert graph.values[node.params.input1_id].datatype == G.Datatype.FP32
        weight = graph.values[node.params.filter_id]
        assert weight.datatype == (G.Datatype.QCINT8 if mode.startswith("int8")
                                   else G.Datatype.QCINT4)
        assert isinstance(weight.quant, G.PerChannelQuant)
        assert weight.quant.num_scales == weight.dims[0]
        # ExecuTorch's runtime would multiply a bias by the scales: it is an Add after.
        assert node.params.bias_id == G.INVALID_VALUE_ID


@pytest.mark.parametrize("mode", MODES)
def test_xnnpack_program_equals_the_weight_only_model_on_exirc(mode: str) -> None:
    reference = _reference(mode)
    result = _compile(mode)
    for seed in (0, 11):
        inputs = _inputs(seed)
        assert_float_rounding(run_exirc(result.data, inputs), _eager(reference, inputs), mode)


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("mode", MODES)
def test_xnnpack_file_runs_on_executorch_without_its_quantized_kernels(
        mode: str, tmp_path: Any) -> None:
    inputs = _inputs(5)
    got, = run_executorch_without_quantized_kernels(_compile(mode).data, inputs, tmp_path)
    assert_float_rounding([got], _eager(_reference(mode), inputs), f"{mode} on ExecuTorch")


def test_grouped_weights_are_refused_for_xnnpack_with_the_reason() -> None:
    with pytest.raises(TargetQuantizationError) as raised:
        compile_module(_model(), _inputs(0), options=CompileOptions(
            target="xnnpack", quantize="int4-weight-only", quantize_group_size=32))
    assert "groups of 32" in str(raised.value)
    assert "8da4w" in (raised.value.hint or "")


def test_grouped_weights_still_compile_for_portable() -> None:
    result = compile_module(_model(), _inputs(0), options=CompileOptions(
        target="portable", quantize="int4-weight-only", quantize_group_size=32))
    assert result.data
