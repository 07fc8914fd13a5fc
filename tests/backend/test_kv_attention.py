"""`--target xnnpack-llm`: KV-cache attention bound to ExecuTorch's llama ops.

An attention the compiler proves equal to `llama::update_cache` +
`llama::custom_sdpa` runs as those two ops, on exirc's runtime (its own
kernels) and on ExecuTorch's (with its LLM custom ops imported), giving what
eager PyTorch and the decomposed program (`--target xnnpack`) give, call after
call to the cache's end, with and without grouped-query heads and for a
prompt of several tokens. A near miss stays decomposed, and says why.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
import torch

from exirc.backend.llama_ops import CUSTOM_SDPA_OUT_SCHEMA, UPDATE_CACHE_OUT_SCHEMA
from exirc.cli.delegation_text import attention_lines
from exirc.compiler import CompileOptions, CompileResult, compile_module
from exirc.inspector.kernels import kernel_needs
from exirc.ir.meta import attention_report
from exirc.ir.state import StateLayoutError
from exirc.runtime import load
from exirc.runtime.errors import ExecutionError
from exirc.runtime.kernels import llama as runtime_llama
from tests.backend import kv_models
from tests.oracle import requires_executorch

MAX = kv_models.MAX_SEQ
LLAMA_OPS = {"llama::update_cache.out", "llama::custom_sdpa.out"}


def _compile(model: torch.nn.Module, length: int, target: str = "xnnpack-llm") -> CompileResult:
    return compile_module(model, kv_models.inputs(length, 0),
                          options=CompileOptions(target=target))


@functools.cache
def _bound(kv_heads: int, length: int) -> CompileResult:
    """`kv_models.make(kv_heads)` (seeded) compiled for xnnpack-llm, once for the module."""
    return _compile(kv_models.make(kv_heads), length)


def _operators(result: CompileResult) -> set[str]:
    return {op.qualified_name for plan in result.program.execution_plan
            for op in plan.operators}


def _calls(length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Calls of `length` tokens at positions 0, length, ..., the last ending at the
    cache's end (rewriting some positions, as eager does too)."""
    starts = [*range(0, MAX - length, length), MAX - length]
    return [kv_models.inputs(length, start) for start in starts]


def _eager(model: torch.nn.Module, length: int) -> list[torch.Tensor]:
    model = copy.deepcopy(model)  # its caches fill up: the model under test keeps its own
    with torch.no_grad():
        return [model(*call) for call in _calls(length)]


def test_the_schemas_are_executorchs_and_the_runtimes_copy_agrees() -> None:
    assert UPDATE_CACHE_OUT_SCHEMA == runtime_llama.UPDATE_CACHE_OUT_SCHEMA
    assert CUSTOM_SDPA_OUT_SCHEMA == runtime_llama.CUSTOM_SDPA_OUT_SCHEMA


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("length", [1, 3, MAX])
def test_bound_attention_equals_eager_and_the_decomposed_program(kv_heads: int,
                                                                 length: int) -> None:
    model = kv_models.make(kv_heads)
    expected = _eager(model, length)
    bound = _bound(kv_heads, length)
    assert _operators(bound) >= LLAMA_OPS
    libraries = {library["name"] for library in kernel_needs(bound.program)["libraries"]}
    assert "llm custom ops" in libraries  # what `exirc inspect` says the file needs
    assert not any(name.startswith("aten::index_put") for name in _operators(bound))
    decomposed = _compile(model, length, target="xnnpack")
    assert not LLAMA_OPS & _operators(decomposed)
    ours, reference = load(bound.data), load(decomposed.data)
    for call, want in zip(_calls(length), expected):
        got = ours.run("forward", list(call))[0]
        torch.testing.assert_close(got, reference.run("forward", list(call))[0])
        torch.testing.assert_close(got, want)


@requires_executorch
@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("length", [1, 3, MAX])
def test_bound_attention_runs_on_executorch_as_eager(kv_heads: int, length: int) -> None:
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401 (its llama kernels)
    from executorch.runtime import Runtime

    model = kv_models.make(kv_heads)
    expected = _eager(model, length)
    method = Runtime.get().load_program(_bound(kv_heads, length).data).load_method("forward")
    for call, want in zip(_calls(length), expected):
        torch.testing.assert_close(method.execute(list(call))[0], want)


@pytest.mark.parametrize(("variant", "kv_heads"),
                         [(variant, 2) for variant in kv_models.NEAR_MISSES]
                         + [("cache_read_twice", 4)])
def test_a_near_miss_stays_decomposed_and_says_why(variant: str, kv_heads: int) -> None:
    model = kv_models.make(kv_heads, variant)
    result = _compile(model, 1)
    assert not LLAMA_OPS & _operators(result)
    report = attention_report(result.planned["forward"].graph_module)
    assert report is not None and not report.bound and len(report.unbound) == 1
    lines = attention_lines(result.planned, summary=False)
    assert lines[0] == ("method forward: attention: 0 of 1 calls bound to "
                        "llama::update_cache + llama::custom_sdpa")
    assert "left decomposed: " in lines[1]
    program = load(result.data)
    for call, want in zip(_calls(1), _eager(model, 1)):
        torch.testing.assert_close(program.run("forward", list(call))[0], want)


def test_methods_reading_one_cache_in_two_layouts_are_refused() -> None:
    """A decode method bound and a prefill (same caches) left decomposed would
    read the one state in two layouts."""
    model = kv_models.make(2)
    near_miss = copy.copy(model)  # the same buffers, so the same state
    near_miss.variant = "lookahead_mask"
    with pytest.raises(StateLayoutError, match="two layouts"):
        compile_module(model, kv_models.inputs(1, 0),
                       methods={"prefill": (near_miss, kv_models.inputs(3, 0))},
                       options=CompileOptions(target="xnnpack-llm"))


def test_runtime_kernels_refuse_positions_past_the_cache() -> None:
    cache, out = torch.zeros(1, MAX, 2, 4), torch.empty(1)
    with pytest.raises(ExecutionError, match="outside the cache"):
        runtime_llama.update_cache_out(torch.ones(1, 2, 2, 4), cache, MAX - 1, out=out)
    assert not cache.any()  # nothing written
    query = torch.zeros(1, 1, 4, 4)
    with pytest.raises(ExecutionError, match="outside the cache"):
        runtime_llama.custom_sdpa_out(query, cache, cache, MAX, None, 0.0, True, 0.5,
                                      out=torch.empty_like(query))


def _kernel_case() -> dict[str, Any]:
    generator = torch.Generator().manual_seed(5)
    return {name: torch.randn(*shape, generator=generator) for name, shape in
            (("query", (1, 3, 4, 4)), ("key", (1, MAX, 2, 4)), ("value", (1, MAX, 2, 4)))}


@requires_executorch
@pytest.mark.parametrize("start", [0, 2, MAX - 3])
def test_runtime_kernels_equal_executorchs_own(start: int) -> None:
    """exirc's kernels and ExecuTorch's (its AOT library's CPU kernels), on one case."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401

    case = _kernel_case()
    ours = runtime_llama.custom_sdpa_out(*case.values(), start, None, 0.0, True, 0.3,
                                         out=torch.empty(1, 3, 4, 4))
    theirs = torch.ops.llama.custom_sdpa(*case.values(), start, None, 0.0, True, 0.3)
    torch.testing.assert_close(ours, theirs)
    mine, their_cache = case["key"].clone(), case["key"].clone()
    runtime_llama.update_cache_out(case["query"][:, :, :2], mine, start, out=torch.empty(1))
    torch.ops.llama.update_cache(case["query"][:, :, :2], their_cache, start)
    assert torch.equal(mine, their_cache)


@pytest.mark.parametrize(("variant", "shortest"), [("exact", 1), ("lookahead_mask", 1),
                                                   ("other_positions", 1), ("exact", 0)])
def test_a_dynamic_length_binds_exact_matches_only(variant: str, shortest: int) -> None:
    """One method for every length shortest..MAX: the proofs hold for each length
    (the exact pattern is bound), a near miss is still one (left decomposed),
    and a method that accepts a length of 0 has no start position to bind."""
    model = kv_models.make(2, variant)
    seq = torch.export.Dim("seq", min=shortest, max=MAX)
    result = compile_module(model, kv_models.inputs(3, 0),
                            dynamic_shapes={"x": {1: seq}, "input_pos": {0: seq}},
                            options=CompileOptions(target="xnnpack-llm"))
    bound = variant == "exact" and shortest == 1
    report = attention_report(result.planned["forward"].graph_module)
    assert report is not None and len(report.bound) == bound
    assert (_operators(result) >= LLAMA_OPS) == bound
    if shortest == 0:
        assert report.unbound[0][1].startswith("the query's length may be 0")
    eager, program = copy.deepcopy(model), load(result.data)
    for length in range(1, MAX + 1):  # lengths 1..MAX, one after another, to the end
        call = kv_models.inputs(length, MAX - length)
        with torch.no_grad():
            want = eager(*call)
        torch.testing.assert_close(program.run("forward", list(call))[0], want)
