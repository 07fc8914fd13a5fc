"""`--quantize 8da4w` / `8da8w`: int8 activations per token at run time, int4 or int8 weights.

Checked against the quantized model run in eager (the rewritten graph module,
what `--verify` compares with): on portable the program computes the same
ops with ExecuTorch's quantized kernels, so exirc's runtime and ExecuTorch's
agree with it within float rounding.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.fx import GraphModule

from exirc.compiler import CompileOptions, CompileResult, compile_module
from exirc.errors import UsageError
from exirc.quantize import QuantizeConfig
from tests.executorch_without_quantized import run_executorch_without_quantized_kernels
from tests.oracle import requires_executorch
from tests.quantize.test_zoo_quantized import (
    _eager,
    assert_float_rounding,
    run_executorch,
    run_exirc,
)

MODES = ("8da4w", "8da8w")
_q = torch.ops.quantized_decomposed


class Mlp(torch.nn.Module):
    """Linear layers on 3-D activations (tokens), one without a bias, one reading
    its weight transposed through mm."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(64, 96)
        self.down = torch.nn.Linear(96, 32, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def _model() -> Mlp:
    torch.manual_seed(3)
    return Mlp().eval()


def _inputs(seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(1, 5, 64, generator=torch.Generator().manual_seed(seed)),)


def _reference(mode: str, group_size: int | None = None) -> GraphModule:
    from exirc.capture import MethodSource, capture
    from exirc.diagnostics.quantization import quantize_sources

    source = MethodSource("forward", _model(), _inputs(0), None, None, "<module>")
    quantized = quantize_sources({"forward": source}, {"forward": capture(source)},
                                 QuantizeConfig(mode, group_size), ())
    module = quantized.sources["forward"].module
    assert isinstance(module, GraphModule)
    return module


_compiled: dict[tuple[str, str], CompileResult] = {}


def _compile(mode: str, target: str) -> CompileResult:
    if (mode, target) not in _compiled:
        # int4 groups of random normal weights sit near 20 dB against float by nature:
        # these tests judge the program against the quantized model, not the mode's
        # accuracy (tests/quantize/test_accuracy.py does), so the bar is lower here.
        _compiled[mode, target] = compile_module(
            _model(), _inputs(0),
            options=CompileOptions(target=target, quantize=mode, min_sqnr_db=15.0))
    return _compiled[mode, target]


def _targets(module: GraphModule) -> list[Any]:
    return [n.target for n in module.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("mode", MODES)
def test_activations_are_quantized_per_token_and_weights_stored_as_integers(mode: str) -> None:
    module = _reference(mode)
    targets = _targets(module)
    assert targets.count(_q.choose_qparams_per_token_asymmetric.default) == 2
    assert targets.count(_q.quantize_per_token.default) == 2
    assert targets.count(_q.dequantize_per_token.default) == 2
    weight_dq = _q.dequantize_per_channel_group.default if mode == "8da4w" \
        else _q.dequantize_per_channel.default
    assert targets.count(weight_dq) == 2
    low, high = (-8, 7) if mode == "8da4w" else (-128, 127)
    tables = [b for name, b in module.named_buffers() if name.endswith(f"_int{mode[3]}")]
    assert len(tables) == 2
    for table in tables:
        assert table.dtype == torch.int8 and low <= int(table.min()) and int(table.max()) <= high
    float_weights = [p for p in module.parameters() if p.dim() == 2]
    assert not float_weights


def test_8da4w_groups_of_32_by_default_with_bf16_scales() -> None:
    module = _reference("8da4w")
    scales = dict(module.named_buffers())
    up = next(v for k, v in scales.items() if "up" in k and k.endswith("_scales"))
    assert tuple(up.shape) == (96, 64 // 32)
    # XNNPACK keeps block scales in bf16: the model is defined with those.
    assert torch.equal(up, up.to(torch.bfloat16).to(torch.float32))
    grouped = _reference("8da4w", group_size=16)
    up16 = next(v for k, v in grouped.named_buffers() if "up" in k and k.endswith("_scales"))
    assert tuple(up16.shape) == (96, 4)


def test_group_size_is_refused_for_8da8w() -> None:
    with pytest.raises(UsageError, match="group size applies to .* not 8da8w"):
        QuantizeConfig("8da8w", group_size=32)


@pytest.mark.parametrize("mode", MODES)
def test_portable_program_equals_the_quantized_model(mode: str) -> None:
    reference = _reference(mode)
    result = _compile(mode, "portable")
    assert result.quantization is not None and result.quantization.mode == mode
    assert result.quantization.weight_bytes < 0.35 * result.quantization.float_weight_bytes
    for seed in (0, 11):
        inputs = _inputs(seed)
        assert_float_rounding(run_exirc(result.data, inputs), _eager(reference, inputs), mode)


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("mode", MODES)
def test_portable_program_runs_on_executorch_like_exirc(mode: str) -> None:
    result = _compile(mode, "portable")
    for seed in (0, 11):
        inputs = _inputs(seed)
        assert_float_rounding(run_executorch(result.data, inputs),
                              run_exirc(result.data, inputs), mode)


# --------------------------------------------------------------------------
# --target xnnpack: XNNPACK's dynamically quantized fully connected nodes.
# --------------------------------------------------------------------------


def _payload_graph(data: bytes) -> Any:
    from exirc.inspector.delegates import program_payloads
    from exirc.serialize.reader import deserialize

    payloads = program_payloads(deserialize(data))
    assert len(payloads) == 1
    assert payloads[0].blob is not None
    return payloads[0].blob.graph


@pytest.mark.parametrize("mode", MODES)
def test_xnnpack_payload_has_qd8_fully_connected_nodes_as_executorch_writes_them(
        mode: str) -> None:
    from exirc.serialize.reader import deserialize
    from exirc.serialize.xnnpack import graph as G

    result = _compile(mode, "xnnpack")
    program = deserialize(result.data)
    operators = {o.name for o in program.execution_plan[0].operators}
    assert not any(name.startswith("quantized_decomposed") for name in operators), operators
    graph = _payload_graph(result.data)
    kinds = [n.kind for n in graph.nodes]
    assert kinds.count(G.NodeKind.FULLY_CONNECTED) == 2
    for node in graph.nodes:
        if node.kind != G.NodeKind.FULLY_CONNECTED:
            continue
        source = graph.values[node.params.input1_id]
        assert source.datatype == G.Datatype.QDINT8
        assert source.quant == G.PerTokenDynamicQuant(1)
        weight = graph.values[node.params.filter_id]
        out = graph.values[node.params.output_id]
        assert out.datatype == G.Datatype.FP32
        if mode == "8da4w":
            assert weight.datatype == G.Datatype.QBINT4
            assert isinstance(weight.quant, G.PerChannelGroupQuant)
            assert weight.quant.group_size == 32
            assert weight.quant.num_scales == weight.dims[0] * weight.dims[1] // 32
        else:
            assert weight.datatype == G.Datatype.QCINT8
            assert isinstance(weight.quant, G.PerChannelQuant)
            assert weight.quant.num_scales == weight.dims[0]
        producer = next(n for n in graph.nodes if n.params.output_id == node.params.input1_id)
        assert producer.kind == G.NodeKind.CONVERT


@pytest.mark.parametrize("mode", MODES)
def test_xnnpack_program_equals_the_quantized_model_on_the_reference_engine(mode: str) -> None:
    from exirc.runtime import load

    reference = _reference(mode)
    result = _compile(mode, "xnnpack")
    for seed in (0, 11):
        inputs = _inputs(seed)
        got = [torch.as_tensor(o) for o in load(result.data, engine="reference")
               .method("forward").run([t.clone() for t in inputs])]
        # XNNPACK picks each token's parameters itself: within float rounding here.
        assert_float_rounding(got, _eager(reference, inputs), mode)
        assert_float_rounding(run_exirc(result.data, inputs), _eager(reference, inputs), mode)


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("mode", MODES)
def test_xnnpack_program_runs_on_executorch_like_the_quantized_model(mode: str) -> None:
    reference = _reference(mode)
    result = _compile(mode, "xnnpack")
    for seed in (0, 11):
        inputs = _inputs(seed)
        assert_float_rounding(run_executorch(result.data, inputs), _eager(reference, inputs),
                              mode)


@requires_executorch
@pytest.mark.oracle
def test_8da4w_xnnpack_file_runs_on_executorch_without_its_quantized_kernels(
        tmp_path: Any) -> None:
    result = _compile("8da4w", "xnnpack")
    inputs = _inputs(5)
    got, = run_executorch_without_quantized_kernels(result.data, inputs, tmp_path)
    assert_float_rounding([got], _eager(_reference("8da4w"), inputs), "8da4w without kernels")


# Decoders (LLaMA- and GPT-2-style, static cache) are tests/quantize/test_dynamic_llms.py's.
