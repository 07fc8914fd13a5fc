"""XNNPACK delegates on onnxruntime (exirc.runtime.engines.onnxruntime): the same
answers as the reference interpreter and eager PyTorch, for programs lowered by
exirc (`--target xnnpack`) and by ExecuTorch's XnnpackPartitioner; delegates the
ONNX form cannot take stay on the reference; `engine=` (EXIRC_ENGINE, `exirc run
--engine`) picks the engine, and asking for one that cannot be had is a typed error."""

from __future__ import annotations

import copy
import functools
import os
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from exirc.compiler import CompileOptions, compile_module
from exirc.errors import FormatError, InputError, UnsupportedOperatorError, UsageError
from exirc.runtime import load
from exirc.runtime.delegates.registry import BackendInitContext, payload
from exirc.runtime.delegates.xnnpack import XnnpackBackend
from exirc.runtime.delegates.xnnpack.run import execute
from exirc.runtime.engines.litert.chain import FUSED_ON_LITERT
from exirc.runtime.engines.litert.interpreter import litert_available
from exirc.runtime.engines.onnxruntime.chain import FUSED
from exirc.runtime.engines.onnxruntime.delegate import OnnxDelegate
from exirc.runtime.engines.onnxruntime.engine import ONNXRUNTIME_ENGINE
from exirc.runtime.engines.policy import ENGINE_VARIABLE, EnginePolicy
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.reader import deserialize_blob
from tests import warm_exirc
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


def delegate_engines(data: bytes, engine: str | None = None) -> list[str]:
    """The engine each delegate of the program runs on, loaded with `engine`."""
    program = load(data, engine=engine)
    return [choice.split(" ")[0] for method in program.methods.values()
            for choice in method.delegate_engines]


def on_onnxruntime(data: bytes) -> OnnxDelegate:
    """The program's only XNNPACK delegate, as the onnxruntime engine prepares it."""
    program = load(data, engine="reference").program
    (delegate,) = [d for plan in program.execution_plan for d in plan.delegates]
    compiled = XnnpackBackend().init(payload(program, delegate), delegate.compile_specs,
                                     BackendInitContext(program, "test"))
    handle = ONNXRUNTIME_ENGINE.prepare_delegate("XnnpackBackend", compiled,
                                                 EnginePolicy("onnxruntime"))
    assert isinstance(handle, OnnxDelegate)
    return handle


def run(data: bytes, inputs: Sequence[torch.Tensor], engine: str | None = None
        ) -> list[torch.Tensor]:
    return load(data, engine=engine).run("forward", [t.clone() for t in inputs])


def assert_close(ours: Sequence[torch.Tensor], theirs: Sequence[torch.Tensor],
                 what: str) -> None:
    assert len(ours) == len(theirs), what
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: output {i}"
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=f"{what}: output {i}")


LOWERINGS = ["exirc", pytest.param("executorch", marks=requires_executorch)]


@pytest.mark.parametrize("by", LOWERINGS)
@pytest.mark.parametrize("name", MAPPED)
def test_onnxruntime_engine_matches_the_reference_and_eager(name: str, by: str) -> None:
    data = lowered(name, by)
    inputs = ZOO[name].inputs()
    engines = delegate_engines(data, "onnxruntime")
    assert engines and set(engines) == {"onnxruntime"}
    on_ort = run(data, inputs, "onnxruntime")
    assert set(delegate_engines(data, "reference")) == {"reference"}
    on_reference = run(data, inputs, "reference")
    assert_close(on_ort, on_reference, f"{name} ({by}): onnxruntime vs the reference")
    assert_close(on_ort, eager(ZOO[name]), f"{name} ({by}): onnxruntime vs eager")


def test_onnxruntime_is_the_default_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENGINE_VARIABLE, raising=False)
    assert set(delegate_engines(exirc_lowered("mobilenet_block"))) == {"onnxruntime"}


@functools.cache
def quantized_mlp() -> bytes:
    """The zoo's MLP quantized to int8: its delegate's nodes are quantized, which the
    ONNX form does not take."""
    model = ZOO["mlp"]
    return compile_module(model.module(), model.inputs(),
                          options=CompileOptions(target="xnnpack", quantize="int8")).data


def test_a_delegate_with_an_unmapped_node_stays_on_the_reference() -> None:
    data = quantized_mlp()
    engines = delegate_engines(data, "auto")
    assert engines and set(engines) == {"reference"}
    # int8 arithmetic: eager's answer within the quantization's own error.
    torch.testing.assert_close(run(data, ZOO["mlp"].inputs())[0], eager(ZOO["mlp"])[0],
                               rtol=0.05, atol=0.05)


def on_onnxruntime_as_on_torch_and_eager(data: bytes, model: torch.nn.Module,
                                         inputs: list[torch.Tensor],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Every delegate of `data` (compiled from `model`) runs on onnxruntime, with the
    reference's and eager's answers."""
    assert set(delegate_engines(data, "onnxruntime")) == {"onnxruntime"}
    on_ort = run(data, inputs, "onnxruntime")
    assert_close(on_ort, run(data, inputs, "reference"), "onnxruntime vs the reference")
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
    data = exirc_lowered("mlp_dynamic_batch")
    model = ZOO["mlp_dynamic_batch"].module()
    program = load(data, engine="onnxruntime")
    for batch in (2, 4, 8):
        x = torch.randn(batch, 12)
        with torch.no_grad():
            expected = model(x)
        assert_close(program.run("forward", [x]), [expected], f"batch {batch}")


def test_a_session_per_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions fix their thread count: a call under another torch count gets its own."""
    delegate = on_onnxruntime(exirc_lowered("mobilenet_block"))
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
    delegate = on_onnxruntime(exirc_lowered("mlp"))
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


def test_asking_for_onnxruntime_when_it_is_not_installed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = exirc_lowered("mlp")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` fails
    with pytest.raises(UsageError) as raised:
        load(data, engine="onnxruntime")
    assert raised.value.code == "E0200"
    assert "onnxruntime or onnx is not installed" in str(raised.value)
    assert "pip install 'exirc[ort]'" in (raised.value.hint or "")
    # auto: the reference runs what no engine can
    assert set(delegate_engines(data, "auto")) == {"reference"}
    assert_close(run(data, ZOO["mlp"].inputs(), "auto"), eager(ZOO["mlp"]),
                 "mlp without onnxruntime")


def exirc_run(program: Path, engine: str, by: str = "option") -> subprocess.CompletedProcess[str]:
    """`exirc run --random` with `engine` given by the option or the environment."""
    option = ["--engine", engine] if by == "option" else []
    environment = {k: v for k, v in os.environ.items() if k != ENGINE_VARIABLE}
    if by == "environment":
        environment[ENGINE_VARIABLE] = engine
    return warm_exirc.exirc(["run", str(program), "--random", *option], text=True,
                            timeout=120, env=environment)


@pytest.mark.parametrize("by", ["option", "environment"])
def test_cli_asking_for_onnxruntime_on_a_delegate_it_cannot_take(tmp_path: Path,
                                                                 by: str) -> None:
    program = tmp_path / "quantized.pte"
    program.write_bytes(quantized_mlp())
    result = exirc_run(program, "onnxruntime", by)
    assert result.returncode == 4, result.stderr
    assert "error[E0400]" in result.stderr
    assert "cannot run on it" in result.stderr
    assert "is torch.int8, not float32" in result.stderr
    assert "Traceback" not in result.stderr
    assert exirc_run(program, "reference", by).returncode == 0


def test_cli_an_unknown_engine_is_a_usage_error(tmp_path: Path) -> None:
    program = tmp_path / "mlp.pte"
    program.write_bytes(exirc_lowered("mlp"))
    result = exirc_run(program, "tensorrt", "environment")
    assert result.returncode == 2, result.stderr
    assert "error[E0200]" in result.stderr
    assert "EXIRC_ENGINE='tensorrt' asks for engine 'tensorrt', which exirc does not have" \
        in result.stderr
    assert "reference, auto, onnxruntime, litert" in result.stderr
    option = exirc_run(program, "tensorrt", "option")
    assert option.returncode == 2 and "'tensorrt' is not one of" in option.stderr
    old = warm_exirc.exirc(["run", str(program), "--random"], text=True, timeout=120,
                           env={**os.environ, "EXIRC_XNNPACK_ENGINE": "torch"})
    assert old.returncode == 2 and "EXIRC_XNNPACK_ENGINE was renamed EXIRC_ENGINE" in old.stderr


@requires_executorch
@pytest.mark.parametrize("name", ["mobilenet_block", "tensor_ops", "conv_bn_relu_maxpool"])
def test_graphs_changed_after_reading_agree_or_fail_typed(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Numbers changed in decoded graphs (as a hostile file would): whatever the torch
    path accepts, onnxruntime either declines (the delegate stays on torch) or
    computes the same; nothing but typed errors escapes."""
    program = load(executorch_lowered(name), engine="reference").program
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
            handle = ONNXRUNTIME_ENGINE.prepare_delegate("XnnpackBackend", compiled,
                                                         EnginePolicy("auto"))
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
                  "run on the reference interpreter: constant 3 is torch.int8, not float32); "
                  "delegates on reference (not on onnxruntime: constant 3 is torch.int8, not "
                  "float32)")])
def test_cli_timing_says_how_plain_runs_go_and_why(program: str, expected: str,
                                                   tmp_path: Path) -> None:
    path = tmp_path / f"{program}.pte"
    path.write_bytes(quantized_mlp() if program == "quantized" else exirc_lowered("mlp"))
    done = warm_exirc.exirc(["run", str(path), "--random", "--repeat", "2"], text=True,
                            timeout=120,
                            env={k: v for k, v in os.environ.items() if k != ENGINE_VARIABLE})
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout.splitlines(), done.stdout
