"""XNNPACK delegates on onnxruntime (exirc.runtime.engines.onnxruntime.delegate): the same
answers as the torch path and eager PyTorch, for programs lowered by exirc
(`--target xnnpack`) and by ExecuTorch's XnnpackPartitioner; delegates the ONNX
form cannot take stay on torch; EXIRC_XNNPACK_ENGINE forces either engine, and
forcing one that cannot be had is a typed error."""

from __future__ import annotations

import copy
import functools
import os
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from exirc.compiler import CompileOptions, compile_module
from exirc.errors import FormatError, InputError, UnsupportedOperatorError, UsageError
from exirc.runtime import load
from exirc.runtime.delegates.registry import BackendInitContext, payload
from exirc.runtime.delegates.xnnpack import XnnpackBackend
from exirc.runtime.delegates.xnnpack.compile import CompiledGraph
from exirc.runtime.delegates.xnnpack.run import execute
from exirc.runtime.engines.litert.engine import litert_available
from exirc.runtime.engines.onnxruntime.chain import FUSED, FUSED_ON_LITERT
from exirc.runtime.engines.onnxruntime.delegate import ENGINE_VARIABLE, OnnxDelegate, choose_engine
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.reader import deserialize_blob
from tests.oracle import requires_executorch
from tests.runtime.delegates.xnnpack.test_executorch_models import _mutate
from tests.runtime.delegates.xnnpack.zoo import ZOO, eager, executorch_xnnpack_pte

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

RTOL, ATOL = 1e-3, 1e-4  # the verify tolerances of the XNNPACK runtime tests

MAPPED = ["mlp", "mobilenet_block", "conv_bn_relu_maxpool", "pooling", "tensor_ops",
          "conv_transpose", "more_ops", "upsample_bilinear"]
"""Zoo models whose every delegate the ONNX form takes: linear + relu/hardtanh; 1x1,
depthwise (multiplier 1 and 2), strided and dilated convolutions, relu6, residual
add, hardswish; batch norm folded, max pooling with padding; average pooling with
and without padding, global average pooling; cat, permute, slice, pad, softmax;
grouped transposed convolutions; PReLU, sin, cos, square, four-way cat; bilinear
resizing, half-pixel and corner-aligned."""


@functools.cache
def exirc_lowered(name: str) -> bytes:
    model = ZOO[name]
    dynamic = model.dynamic_shapes() if model.dynamic_shapes else None
    return compile_module(model.module(), model.inputs(), dynamic_shapes=dynamic,
                          options=CompileOptions(target="xnnpack")).data


@functools.cache
def executorch_lowered(name: str) -> bytes:
    return executorch_xnnpack_pte(ZOO[name])


def lowered(name: str, by: str) -> bytes:
    return exirc_lowered(name) if by == "exirc" else executorch_lowered(name)


def handles(data: bytes) -> list[Any]:
    """The handle XnnpackBackend.init gives each XNNPACK delegate of the program."""
    program = load(data).program
    return [XnnpackBackend().init(payload(program, delegate), delegate.compile_specs,
                                  BackendInitContext(program, "test"))
            for plan in program.execution_plan for delegate in plan.delegates
            if delegate.id == "XnnpackBackend"]


def run(data: bytes, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return load(data).run("forward", [t.clone() for t in inputs])


def assert_close(ours: Sequence[torch.Tensor], theirs: Sequence[torch.Tensor],
                 what: str) -> None:
    assert len(ours) == len(theirs), what
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: output {i}"
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=f"{what}: output {i}")


LOWERINGS = ["exirc", pytest.param("executorch", marks=requires_executorch)]


@pytest.mark.parametrize("by", LOWERINGS)
@pytest.mark.parametrize("name", MAPPED)
def test_onnxruntime_engine_matches_torch_engine_and_eager(
        name: str, by: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = lowered(name, by)
    inputs = ZOO[name].inputs()
    monkeypatch.setenv(ENGINE_VARIABLE, "onnxruntime")
    engines = handles(data)
    assert engines and all(isinstance(h, OnnxDelegate) for h in engines)
    on_ort = run(data, inputs)
    monkeypatch.setenv(ENGINE_VARIABLE, "torch")
    assert all(isinstance(h, CompiledGraph) for h in handles(data))
    on_torch = run(data, inputs)
    assert_close(on_ort, on_torch, f"{name} ({by}): onnxruntime vs torch engine")
    assert_close(on_ort, eager(ZOO[name]), f"{name} ({by}): onnxruntime vs eager")


def test_onnxruntime_is_the_default_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENGINE_VARIABLE, raising=False)
    assert all(isinstance(h, OnnxDelegate) for h in handles(exirc_lowered("mobilenet_block")))


@functools.cache
def quantized_mlp() -> bytes:
    """The zoo's MLP quantized to int8: its delegate's nodes are quantized, which the
    ONNX form does not take."""
    model = ZOO["mlp"]
    return compile_module(model.module(), model.inputs(),
                          options=CompileOptions(target="xnnpack", quantize="int8")).data


def test_a_delegate_with_an_unmapped_node_stays_on_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    data = quantized_mlp()
    monkeypatch.setenv(ENGINE_VARIABLE, "auto")
    engines = handles(data)
    assert engines and all(isinstance(h, CompiledGraph) for h in engines)
    # int8 arithmetic: eager's answer within the quantization's own error.
    torch.testing.assert_close(run(data, ZOO["mlp"].inputs())[0], eager(ZOO["mlp"])[0],
                               rtol=0.05, atol=0.05)


def on_onnxruntime_as_on_torch_and_eager(data: bytes, model: torch.nn.Module,
                                         inputs: list[torch.Tensor],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Every delegate of `data` (compiled from `model`) runs on onnxruntime, with the
    torch engine's and eager's answers."""
    monkeypatch.setenv(ENGINE_VARIABLE, "onnxruntime")
    assert all(isinstance(h, OnnxDelegate) for h in handles(data))
    on_ort = run(data, inputs)
    monkeypatch.setenv(ENGINE_VARIABLE, "torch")
    assert_close(on_ort, run(data, inputs), "onnxruntime vs torch engine")
    with torch.no_grad():
        assert_close(on_ort, [model(*inputs)], "onnxruntime vs eager")


@pytest.mark.parametrize("align", [False, True], ids=["half_pixel", "align_corners"])
def test_bilinear_resizing_runs_on_onnxruntime_as_torch_resizes(
        align: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.Upsample(
        scale_factor=(2.0, 3.0), mode="bilinear", align_corners=align)).eval()
    inputs = [torch.randn(1, 3, 5, 4)]
    data = compile_module(model, inputs, options=CompileOptions(target="xnnpack")).data
    on_onnxruntime_as_on_torch_and_eager(data, model, inputs, monkeypatch)


def test_a_call_of_another_shape_runs_on_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ONNX model has the blob's static dims; a smaller dynamic batch still runs
    (on the torch path), and the declared one on onnxruntime, both rightly."""
    monkeypatch.setenv(ENGINE_VARIABLE, "onnxruntime")
    data = exirc_lowered("mlp_dynamic_batch")
    model = ZOO["mlp_dynamic_batch"].module()
    program = load(data)
    for batch in (2, 4, 8):
        x = torch.randn(batch, 12)
        with torch.no_grad():
            expected = model(x)
        assert_close(program.run("forward", [x]), [expected], f"batch {batch}")


def test_a_session_per_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions fix their thread count: a call under another torch count gets its own."""
    monkeypatch.setenv(ENGINE_VARIABLE, "onnxruntime")
    (delegate,) = handles(exirc_lowered("mobilenet_block"))
    assert isinstance(delegate, OnnxDelegate)
    graph = delegate.fallback
    inputs = [torch.randn(e.dims) for e in graph.inputs]
    saved = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            ours = [torch.empty(e.dims) for e in graph.outputs]
            delegate.execute([*inputs, *ours])
            theirs = [torch.empty(e.dims) for e in graph.outputs]
            execute(graph, [*inputs, *theirs])
            assert_close(ours, theirs, f"{threads} threads")
    finally:
        torch.set_num_threads(saved)
    assert sorted(delegate._sessions) == [1, 2]


def test_a_reused_binding_follows_what_the_arguments_are_now(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Repeated calls reuse the binding made for the same tensors; a call whose list
    was changed in place, whose output was resized away, or whose tensors moved is
    checked afresh and still gets the right answer, wherever it runs."""
    monkeypatch.setenv(ENGINE_VARIABLE, "onnxruntime")
    (delegate,) = handles(exirc_lowered("mlp"))
    assert isinstance(delegate, OnnxDelegate)
    graph = delegate.fallback

    def expected(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        theirs = [torch.empty(e.dims) for e in graph.outputs]
        execute(graph, [*inputs, *theirs])
        return theirs

    inputs = [torch.randn(e.dims) for e in graph.inputs]
    outputs = [torch.empty(e.dims) for e in graph.outputs]
    args = [*inputs, *outputs]
    for _ in range(2):  # the second call takes the reuse path
        inputs[0].copy_(torch.randn(inputs[0].shape))
        delegate.execute(args)
        assert_close(outputs, expected(inputs), "the same tensors again")
    binding = delegate._binding

    fresh = torch.randn(graph.inputs[0].dims)  # the list changed in place
    args[0] = fresh
    delegate.execute(args)
    assert_close(outputs, expected([fresh, *inputs[1:]]), "a new input in the same list")
    assert delegate._binding is not binding

    args[0] = inputs[0]
    delegate.execute(args)
    outputs[0].resize_(1)  # resized by someone else: the call rebinds or falls back
    delegate.execute(args)
    assert tuple(outputs[0].shape) == graph.outputs[0].dims
    assert_close(outputs, expected(inputs), "an output resized between calls")

    inputs[0].set_(torch.randn(graph.inputs[0].dims).untyped_storage())  # moved in place
    inputs[0].resize_(graph.inputs[0].dims)
    delegate.execute(args)
    assert_close(outputs, expected(inputs), "an input moved to new memory")


def test_forcing_onnxruntime_when_it_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    data = exirc_lowered("mlp")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` fails
    monkeypatch.setenv(ENGINE_VARIABLE, "onnxruntime")
    with pytest.raises(UsageError) as raised:
        load(data)
    assert raised.value.code == "E0200"
    assert "onnxruntime or onnx is not installed" in str(raised.value)
    assert "pip install 'exirc[ort]'" in (raised.value.hint or "")
    monkeypatch.setenv(ENGINE_VARIABLE, "auto")  # without the variable: the torch path
    assert all(isinstance(h, CompiledGraph) for h in handles(data))
    assert_close(run(data, ZOO["mlp"].inputs()), eager(ZOO["mlp"]), "mlp without onnxruntime")


def exirc_run(program: Path, engine: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "exirc", "run", str(program), "--random"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, ENGINE_VARIABLE: engine})


def test_cli_forcing_onnxruntime_on_a_delegate_it_cannot_take(tmp_path: Path) -> None:
    program = tmp_path / "quantized.pte"
    program.write_bytes(quantized_mlp())
    result = exirc_run(program, "onnxruntime")
    assert result.returncode == 4, result.stderr
    assert "error[E0400]" in result.stderr
    assert "cannot run on onnxruntime" in result.stderr
    assert "is torch.int8, not float32" in result.stderr
    assert "Traceback" not in result.stderr
    assert exirc_run(program, "torch").returncode == 0


def test_cli_an_unknown_engine_is_a_usage_error(tmp_path: Path) -> None:
    program = tmp_path / "mlp.pte"
    program.write_bytes(exirc_lowered("mlp"))
    result = exirc_run(program, "tensorrt")
    assert result.returncode == 2, result.stderr
    assert "error[E0200]" in result.stderr
    assert "EXIRC_XNNPACK_ENGINE='tensorrt' is not an XNNPACK engine" in result.stderr
    assert "auto, torch, onnxruntime" in result.stderr


@requires_executorch
@pytest.mark.parametrize("name", ["mobilenet_block", "tensor_ops", "conv_bn_relu_maxpool"])
def test_graphs_changed_after_reading_agree_or_fail_typed(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Numbers changed in decoded graphs (as a hostile file would): whatever the torch
    path accepts, onnxruntime either declines (the delegate stays on torch) or
    computes the same; nothing but typed errors escapes."""
    monkeypatch.setenv(ENGINE_VARIABLE, "auto")
    program = load(executorch_lowered(name)).program
    context = BackendInitContext(program, "fuzz")
    rng = random.Random(7)
    on_ort = 0
    for delegate in program.execution_plan[0].delegates:
        blob = deserialize_blob(payload(program, delegate))
        for _ in range(40):
            graph = copy.deepcopy(blob.graph)
            _mutate(graph, rng)
            try:
                compiled = XnnpackBackend().prepare(G.XnnpackBlob(graph, blob.constant_region),
                                                    context)
            except (FormatError, UnsupportedOperatorError):
                continue
            handle = choose_engine(graph, compiled)
            if not isinstance(handle, OnnxDelegate):
                continue
            on_ort += 1
            inputs = [torch.randn(e.dims) for e in compiled.inputs]
            ours = [torch.empty(e.dims) for e in compiled.outputs]
            theirs = [torch.empty(e.dims) for e in compiled.outputs]
            try:
                execute(compiled, [*inputs, *theirs])
            except InputError:
                with pytest.raises(InputError):
                    handle.execute([*inputs, *ours])
                continue
            handle.execute([*inputs, *ours])
            for a, b in zip(ours, theirs):
                torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, equal_nan=True)
    assert on_ort > 0


class ScoresByTransposedKeys(torch.nn.Module):
    """Attention as Llama-style models write it: q @ k^T, XNNPACK's batch matrix
    multiply with XNN_FLAG_TRANSPOSE_B (k is read as [.., N, K])."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = q @ k.transpose(-1, -2) / 8**0.5
        return torch.softmax(scores, dim=-1) @ v + torch.nn.functional.scaled_dot_product_attention(
            q, k, v)


@pytest.mark.parametrize("shape", [(1, 4, 8, 8), (2, 6, 5)], ids=["4d", "3d"])
def test_a_batch_matrix_multiply_by_a_transposed_input_runs_on_onnxruntime(
        shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = ScoresByTransposedKeys().eval()
    inputs = [torch.randn(shape) for _ in range(3)]
    data = compile_module(model, inputs, options=CompileOptions(target="xnnpack")).data
    program = load(data).program
    blobs = [deserialize_blob(payload(program, d)) for plan in program.execution_plan
             for d in plan.delegates]
    assert any(node.kind == G.NodeKind.BATCH_MATRIX_MULTIPLY and node.params.flags
               for blob in blobs for node in blob.graph.nodes), "expected a TRANSPOSE_B node"
    on_onnxruntime_as_on_torch_and_eager(data, model, inputs, monkeypatch)


@pytest.mark.parametrize(("program", "expected"), [
    ("mlp", "plain runs: " + (FUSED_ON_LITERT if litert_available() else
                              f"{FUSED} (not on LiteRT: ai-edge-litert is not installed)")),
    ("quantized", "plain runs: instruction by instruction (not fused: its XNNPACK delegates "
                  "run on torch: constant 3 is torch.int8, not float32)")])
def test_cli_timing_says_how_plain_runs_go_and_why(program: str, expected: str,
                                                   tmp_path: Path) -> None:
    path = tmp_path / f"{program}.pte"
    path.write_bytes(quantized_mlp() if program == "quantized" else exirc_lowered("mlp"))
    done = subprocess.run([sys.executable, "-m", "exirc", "run", str(path), "--random",
                           "--repeat", "2"], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != ENGINE_VARIABLE})
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout.splitlines(), done.stdout
