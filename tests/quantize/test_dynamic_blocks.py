"""8da4w on `--target xnnpack` for layers whose input features are not a multiple of 32.

ExecuTorch 1.5.1's runtime refuses a blockwise (qbint4) filter whose blocks are
not a multiple of 32 input channels: the method fails to load. A layer whose
row is one group of such a length (8da4w's default groups of 32 do not divide
it) is a per-channel qcint4 filter instead, which that runtime runs (XNNPACK's
qd8-f32-qc4w GEMM); groups that cannot be either, and rows of an odd length,
are refused at compile time with the reason, never written as a file that
fails on the device or quantizes activations outside the delegate.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from exirc.compiler import CompileOptions, CompileResult, compile_module
from exirc.errors import ExircError, TargetQuantizationError
from tests.executorch_without_quantized import run_executorch_without_quantized_kernels
from tests.oracle import requires_executorch


def _layer(features: int) -> torch.nn.Module:
    torch.manual_seed(4)
    return torch.nn.Sequential(torch.nn.Linear(features, 24), torch.nn.ReLU(),
                               torch.nn.Linear(24, 16, bias=False)).eval()


def _inputs(features: int, seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(1, 5, features, generator=torch.Generator().manual_seed(seed)),)


def _compile(features: int, group_size: int | None = None) -> CompileResult:
    return compile_module(_layer(features), _inputs(features, 0), options=CompileOptions(
        target="xnnpack", quantize="8da4w", quantize_group_size=group_size, min_sqnr_db=0.0),
        warn=False)


def _filters(data: bytes) -> list[Any]:
    from exirc.inspector.delegates import program_payloads
    from exirc.serialize.reader import deserialize
    from exirc.serialize.xnnpack import graph as G

    found = []
    for payload in program_payloads(deserialize(data)):
        assert payload.blob is not None
        graph = payload.blob.graph
        found += [graph.values[n.params.filter_id] for n in graph.nodes
                  if n.kind == G.NodeKind.FULLY_CONNECTED]
    return found


def _operators(data: bytes) -> set[str]:
    from exirc.serialize.reader import deserialize

    return {o.name for plan in deserialize(data).execution_plan for o in plan.operators}


@pytest.fixture(scope="module")
def rows_of_48() -> CompileResult:
    return _compile(48)


def test_a_row_of_48_is_one_qcint4_filter_per_channel(rows_of_48: CompileResult) -> None:
    from exirc.serialize.xnnpack import graph as G

    first, second = _filters(rows_of_48.data)
    assert first.datatype == G.Datatype.QCINT4  # 48: one group a row, not a multiple of 32
    assert isinstance(first.quant, G.PerChannelQuant) and first.quant.num_scales == 24
    assert second.datatype == G.Datatype.QCINT4  # 24 inputs
    assert not any(name.startswith("quantized_decomposed") for name in _operators(rows_of_48.data))


def test_a_row_of_48_equals_the_quantized_model_on_exirc(rows_of_48: CompileResult) -> None:
    from exirc.runtime import load

    method = load(rows_of_48.data, engine="reference").method("forward")
    for seed in (1, 2):
        inputs = _inputs(48, seed)
        got = torch.as_tensor(method.run([t.clone() for t in inputs])[0])
        want = rows_of_48.quantized_modules["forward"](*inputs)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@requires_executorch
@pytest.mark.oracle
def test_a_row_of_48_runs_on_executorch_without_quantized_kernels_bit_for_bit(
        rows_of_48: CompileResult, tmp_path: Any) -> None:
    from exirc.runtime import load

    inputs = _inputs(48, 3)
    theirs, = run_executorch_without_quantized_kernels(rows_of_48.data, inputs, tmp_path)
    ours = torch.as_tensor(load(rows_of_48.data, engine="reference").method("forward")
                           .run([t.clone() for t in inputs])[0])
    assert torch.equal(theirs, ours)  # x86 VNNI, as tests/runtime/delegates/xnnpack check


def test_groups_of_48_are_refused_with_the_reason() -> None:
    with pytest.raises(TargetQuantizationError, match=r"groups of 48.*multiple of 32") as info:
        _compile(96, group_size=48)
    assert "--group-size" in (info.value.hint or "")


def test_an_odd_row_is_refused_with_the_reason() -> None:
    with pytest.raises(TargetQuantizationError, match=r"odd number of input channels \(33\)"):
        _compile(33)


def test_exircs_runtime_refuses_blocks_of_16_as_executorchs_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from exirc.backend.xnnpack import dynamic_linear

    # Write the file the compiler refuses to write: qbint4 blocks of 16.
    monkeypatch.setattr(dynamic_linear, "BLOCK_MULTIPLE", 16)
    with pytest.raises(ExircError, match=r"blocks of 16 input channels, not a multiple of 32"):
        _compile(64, group_size=16)
