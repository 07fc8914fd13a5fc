"""`--target xnnpack-llm` binds the attention of a method whose length is dynamic.

transformers' static-cache wrapper exported with one `forward` of a dynamic
length (1..BOUND, as ExecuTorch's `export_llm` exports, and as the LLM runner
prefills a whole prompt in one call): every attention call is bound to
`llama::update_cache` + `llama::custom_sdpa`, and at each prompt length,
prefilled in one call and followed by decode steps on the same cache, its
logits equal eager's and the decomposed `--target xnnpack` file's on exirc's
runtime, and eager's on ExecuTorch's runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from exirc.cli.delegation_text import attention_lines
from exirc.compiler import CompileOptions, CompileResult, compile_module
from exirc.runtime import load
from tests.oracle import requires_executorch
from tests.state.test_static_cache import _decoder, _inputs

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore:A model attribute:UserWarning")

BOUND, DECODE = 8, 2
LLAMA_OPS = {"llama::update_cache.out", "llama::custom_sdpa.out"}
Step = Callable[[tuple[Any, ...]], torch.Tensor]


def _compile(model: torch.nn.Module, target: str) -> CompileResult:
    seq = torch.export.Dim("seq", min=1, max=BOUND)
    return compile_module(model, _inputs([0] * 3, 0),
                          dynamic_shapes={"input_ids": {1: seq}, "inputs_embeds": None,
                                          "cache_position": {0: seq}},
                          options=CompileOptions(target=target))


def _calls() -> list[tuple[Any, ...]]:
    """Per prompt length 1..BOUND: the prompt from position 0, then DECODE tokens."""
    calls: list[tuple[Any, ...]] = []
    for length in range(1, BOUND + 1):
        calls.append(_inputs([(5 * i + length) % 64 for i in range(length)], 0))
        calls += [_inputs([(7 * length + p) % 64], p) for p in range(length, length + DECODE)]
    return calls


def _run(step: Step) -> list[torch.Tensor]:
    return [step(call) for call in _calls()]


def _eager(model: torch.nn.Module) -> list[torch.Tensor]:
    saved = {name: buffer.clone() for name, buffer in model.named_buffers()}
    try:
        with torch.no_grad():
            return _run(lambda inputs: model(*inputs))
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(saved[name])


def _operators(result: CompileResult) -> set[str]:
    return {op.qualified_name for plan in result.program.execution_plan
            for op in plan.operators}


@pytest.fixture(scope="module")
def compiled() -> tuple[list[torch.Tensor], CompileResult, CompileResult]:
    model = _decoder("llama")
    return _eager(model), _compile(model, "xnnpack-llm"), _compile(model, "xnnpack")


def test_every_attention_of_the_dynamic_method_is_bound(compiled: Any) -> None:
    _, bound, decomposed = compiled
    assert attention_lines(bound.planned, summary=False) == [
        "method forward: attention: 2 of 2 calls bound to "
        "llama::update_cache + llama::custom_sdpa"]
    assert _operators(bound) >= LLAMA_OPS
    assert not any(name.startswith("aten::index_put") for name in _operators(bound))
    assert not LLAMA_OPS & _operators(decomposed)
    # the projections and MLP around the bound ops still run in XNNPACK
    assert not {"addmm", "mm", "bmm"} & {e.op for e in bound.delegation["forward"].left_out}


def test_each_length_equals_eager_and_the_decomposed_file_on_exirc(compiled: Any) -> None:
    expected, bound, decomposed = compiled
    ours, reference = load(bound.data), load(decomposed.data)
    got = _run(lambda inputs: ours.run("forward", [inputs[0], inputs[2]])[0])
    want = _run(lambda inputs: reference.run("forward", [inputs[0], inputs[2]])[0])
    for mine, theirs, eager in zip(got, want, expected, strict=True):
        torch.testing.assert_close(mine, theirs)
        torch.testing.assert_close(mine, eager)


@requires_executorch
def test_each_length_equals_eager_on_executorch(compiled: Any) -> None:
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401 (its llama kernels)
    from executorch.runtime import Runtime

    expected, bound, _ = compiled
    program = Runtime.get().load_program(bound.data)  # alive while its method runs
    method = program.load_method("forward")
    got = _run(lambda inputs: method.execute((inputs[0], inputs[2]))[0])
    for mine, eager in zip(got, expected, strict=True):
        torch.testing.assert_close(mine, eager)
