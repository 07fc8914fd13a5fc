"""Models quantized already with torchao's `quantize_` compile like exirc's own modes.

Their exported graphs hold torchao's affine ops and subclass weights;
`exirc.quantize.torchao_ops` turns them into the quantized_decomposed ops of
`--quantize 8da4w / 8da8w / int4-weight-only`, so XNNPACK gets the same nodes
and portable runs them with the quantized kernels.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import pytest
import torch

from exirc.compiler import CompileOptions, compile_module
from tests.oracle import requires_executorch
from tests.quantize.test_dynamic_quant import Mlp
from tests.quantize.test_zoo_quantized import _eager, run_executorch, run_exirc

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                reason="needs torchao")

# Grouped int4 weight-only layers: ExecuTorch's XNNPACK takes none (a typed refusal).
PORTABLE_ONLY = {"int4_weight_only"}
# name -> exirc's own mode for the same scheme.
CONFIGS = {"8da4w": "8da4w", "8da8w": "8da8w", "int4_weight_only": "int4-weight-only"}


def _config(name: str) -> Any:
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerAxis, PerGroup

    if name == "8da4w":
        return Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4,
                                                     weight_granularity=PerGroup(32))
    if name == "8da8w":
        return Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8,
                                                     weight_granularity=PerAxis(0))
    return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))


def _float_model() -> Mlp:
    torch.manual_seed(3)
    return Mlp().eval()


@functools.cache
def _quantized(name: str) -> torch.nn.Module:
    from torchao.quantization import quantize_

    module = _float_model()
    quantize_(module, _config(name))
    return module


def _inputs(seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(seed)),)


@functools.cache
def _compile(name: str, target: str) -> bytes:
    return compile_module(_quantized(name), _inputs(0), options=CompileOptions(target=target)).data


def _payload_nodes(data: bytes) -> list[tuple[Any, ...]]:
    from exirc.inspector.delegates import program_payloads
    from exirc.serialize.reader import deserialize

    nodes = []
    for payload in program_payloads(deserialize(data)):
        assert payload.blob is not None
        graph = payload.blob.graph
        for node in graph.nodes:
            params = node.params
            filter_id = getattr(params, "filter_id", None)
            if filter_id is None:
                nodes.append((node.kind,))
                continue
            weight, source = graph.values[filter_id], graph.values[params.input1_id]
            nodes.append((node.kind, weight.datatype, type(weight.quant).__name__,
                          getattr(weight.quant, "group_size", None), tuple(weight.dims),
                          source.datatype))
    return nodes


def _operators(data: bytes) -> list[str]:
    from exirc.serialize.reader import deserialize

    return sorted(o.name for o in deserialize(data).execution_plan[0].operators)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_torchao_model_lowers_to_the_nodes_of_exircs_own_mode(name: str) -> None:
    if name in PORTABLE_ONLY:  # refused on XNNPACK, as exirc's own mode is
        from exirc.errors import TargetQuantizationError

        with pytest.raises(TargetQuantizationError, match="groups of 32"):
            _compile(name, "xnnpack")
        return
    ours = compile_module(_float_model(), _inputs(0), options=CompileOptions(
        target="xnnpack", quantize=CONFIGS[name], quantize_group_size=None
        if name == "8da8w" else 32)).data
    theirs = _compile(name, "xnnpack")
    assert _payload_nodes(theirs) == _payload_nodes(ours)
    assert _operators(theirs) == _operators(ours)
    portable = _operators(_compile(name, "portable"))
    assert not any(op.startswith("torchao") for op in portable), portable


@pytest.mark.parametrize("target", ["portable", "xnnpack"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_torchao_model_runs_like_the_quantized_eager_model(name: str, target: str) -> None:
    if target == "xnnpack" and name in PORTABLE_ONLY:
        pytest.skip("refused on XNNPACK (test_torchao_model_lowers_to_the_nodes_...)")
    data = _compile(name, target)
    for seed in (0, 7):
        inputs = _inputs(seed)
        expected = _eager(_quantized(name), inputs)
        got = run_exirc(data, inputs)
        # torchao's eager ops and the kernels may round a token's scale differently
        # in the last bit, which can move one integer by one: within 1% of the range.
        for a, b in zip(got, expected):
            assert float((a - b).abs().max()) <= 0.01 * float(b.abs().max()), (name, target)


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("target", ["portable", "xnnpack"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_torchao_model_runs_on_executorch_like_exirc(name: str, target: str) -> None:
    if target == "xnnpack" and name in PORTABLE_ONLY:
        pytest.skip("refused on XNNPACK (test_torchao_model_lowers_to_the_nodes_...)")
    data = _compile(name, target)
    for seed in (0, 7):
        inputs = _inputs(seed)
        theirs, ours = run_executorch(data, inputs), run_exirc(data, inputs)
        for a, b in zip(ours, theirs):
            if target == "xnnpack" and name != "int4_weight_only":
                # XNNPACK's dynamically quantized arithmetic, reproduced exactly (weight-only
                # layers run as float fully connected nodes: float32 rounding).
                assert torch.equal(a, b), (name, float((a - b).abs().max()))
            else:
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", ["portable", "xnnpack"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_torchao_model_verifies(name: str, target: str) -> None:
    """--verify compares with the model as compiled (4-bit block scales in bf16, as
    XNNPACK keeps them): within float rounding on both targets."""
    if target == "xnnpack" and name in PORTABLE_ONLY:
        pytest.skip("refused on XNNPACK (test_torchao_model_lowers_to_the_nodes_...)")
    result = compile_module(_quantized(name), _inputs(0),
                            options=CompileOptions(target=target, verify=True))
    assert result.data == _compile(name, target)
