"""Dynamic (upper-bounded) sequence lengths delegated to XNNPACK (issue 32).

Our files run on ExecuTorch's runtime at every length from 1 to the bound,
equal to eager: a transformer block and a decoder's prefill with a KV cache.
What XNNPACK cannot resize stays on the interpreter with a reason.
"""

from __future__ import annotations

import copy
import functools
import re

import pytest
import torch

from exirc.backend.xnnpack.sizes import SizeMismatch, reconcile
from exirc.compiler import CompileOptions, CompileResult, compile_module
from exirc.inspector.delegates import program_payloads
from exirc.runtime import load
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.reader import deserialize_blob
from tests.backend.xnnpack.dynamic_models import BOUND, Ops, block, block_input, seq_dim
from tests.oracle import load_with_executorch, requires_executorch
from tests.state.cache_models import VOCAB, Step, eager_tokens, generate, make_decoder

LENGTHS = range(1, BOUND + 1)


@functools.cache
def compiled_block() -> CompileResult:
    return compile_module(block(), (block_input(5),), dynamic_shapes=({1: seq_dim()},),
                          options=CompileOptions(target="xnnpack"))


def decoder() -> torch.nn.Module:
    return make_decoder("index_copy", True, False)


@functools.cache
def compiled_decoder() -> CompileResult:
    example = (torch.tensor([[1, 2, 3, 4]]), torch.arange(4))
    seq = seq_dim()
    return compile_module(decoder(), example, dynamic_shapes=({1: seq}, {0: seq}),
                          options=CompileOptions(target="xnnpack"))


def blobs(result: CompileResult) -> list[G.XnnpackBlob]:
    return [deserialize_blob(p.data) for p in program_payloads(result.program)]


def left_out(result: CompileResult, method: str = "forward") -> dict[str, str]:
    return {entry.op: entry.reason for entry in result.delegation[method].left_out}


def test_the_block_is_delegated_but_for_what_xnnpack_cannot_resize() -> None:
    out = left_out(compiled_block())
    # Every linear, norm, softmax, matmul and the qkv split run in XNNPACK; the
    # attention weights' views merge two dynamic dims, which XNNPACK's reshape
    # cannot infer, so they stay out, saying so.
    assert set(out) == {"sym_size.int", "view_copy"}, out
    assert re.fullmatch(r"aten.view_copy.default makes 2 dynamic dims \[(1, )?2, (\w+), \2\]; "
                        r"XNNPACK's reshape infers one dim at run time", out["view_copy"]), out


def test_payloads_carry_upper_bounds_and_infer_the_dynamic_dim() -> None:
    found = blobs(compiled_block())
    assert found
    reshapes = [n.params for b in found for n in b.graph.nodes
                if n.kind == G.NodeKind.STATIC_RESHAPE]
    slices = [n.params for b in found for n in b.graph.nodes if n.kind == G.NodeKind.STATIC_SLICE]
    assert reshapes and all(list(p.new_shape).count(0) == 1 for p in reshapes)  # type: ignore
    assert len(slices) == 3 and all(list(p.sizes)[1] == 0 for p in slices)  # type: ignore
    first = found[0].graph
    assert first.values[first.input_ids[0]].dims == [1, BOUND, 8]


@requires_executorch
@pytest.mark.oracle
def test_the_block_matches_eager_on_executorch_at_every_length() -> None:
    from tests.runtime.delegates.xnnpack.zoo import run_with_executorch_runtime

    data, model = compiled_block().data, block()
    for length in LENGTHS:
        x = block_input(length)
        with torch.no_grad():
            expected = model(x)
        (theirs,) = run_with_executorch_runtime(data, (x,))
        torch.testing.assert_close(theirs, expected, rtol=1e-5, atol=1e-5,
                                   msg=f"length {length}")
        (ours,) = load(data).run("forward", [x])
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5, msg=f"length {length}")


@requires_executorch
@pytest.mark.oracle
def test_more_operators_are_delegated_and_match_eager_at_every_length() -> None:
    from tests.runtime.delegates.xnnpack.zoo import run_with_executorch_runtime

    torch.manual_seed(3)
    model, seq = Ops().eval(), seq_dim()
    result = compile_module(model, (block_input(5), 2 * block_input(5) - 1),
                            dynamic_shapes=({1: seq}, {1: seq}),
                            options=CompileOptions(target="xnnpack"))
    assert set(left_out(result)) == {"sym_size.int"}
    for length in LENGTHS:
        inputs = (block_input(length), 2 * block_input(length) - 1)
        with torch.no_grad():
            expected = model(*inputs)
        for name, got in (("ExecuTorch", run_with_executorch_runtime(result.data, inputs)),
                          ("exirc", load(result.data).run("forward", list(inputs)))):
            for i, (a, b) in enumerate(zip(got, expected, strict=True)):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5,
                                           msg=f"{name}, length {length}, output {i}")


@requires_executorch
@pytest.mark.oracle
def test_a_bound_of_two_still_infers_the_dynamic_dim() -> None:
    """With max=2 the only other length in range is 1: the payload's reshapes
    must still infer the length, not keep 2."""
    from tests.runtime.delegates.xnnpack.zoo import run_with_executorch_runtime

    model = block()
    result = compile_module(model, (block_input(2),),
                            dynamic_shapes=({1: torch.export.Dim("seq", min=1, max=2)},),
                            options=CompileOptions(target="xnnpack"))
    reshapes = [n.params for b in blobs(result) for n in b.graph.nodes
                if n.kind == G.NodeKind.STATIC_RESHAPE]
    assert reshapes and all(0 in p.new_shape for p in reshapes)  # type: ignore[union-attr]
    for length in (1, 2):
        x = block_input(length)
        with torch.no_grad():
            expected = model(x)
        (theirs,) = run_with_executorch_runtime(result.data, (x,))
        torch.testing.assert_close(theirs, expected, rtol=1e-5, atol=1e-5)


def _prefill_eager(length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(length))
    positions = torch.arange(length)
    with torch.no_grad():
        return tokens, positions, copy.deepcopy(decoder())(tokens, positions)


def test_a_decoder_prefill_is_delegated() -> None:
    out = left_out(compiled_decoder())
    assert not {"addmm", "bmm", "_softmax", "native_layer_norm"} & set(out), out


@requires_executorch
@pytest.mark.oracle
def test_a_decoder_prefill_matches_eager_on_both_runtimes_at_every_length() -> None:
    data = compiled_decoder().data
    for length in LENGTHS:
        tokens, positions, expected = _prefill_eager(length)
        scale = float(expected.abs().max())
        # Each length on a fresh load: the cache starts empty, as eager's does.
        theirs = load_with_executorch(data).forward([tokens, positions])[0]
        ours = load(data).run("forward", [tokens, positions])[0]
        for name, got in (("ExecuTorch", theirs), ("exirc", ours)):
            torch.testing.assert_close(got, expected, rtol=0, atol=2e-6 * scale,
                                       msg=f"{name}, length {length}")
            assert torch.equal(got[0].argmax(-1), expected[0].argmax(-1)), (name, length)


@requires_executorch
@pytest.mark.oracle
def test_a_dynamic_prefill_and_decode_generate_the_eager_tokens() -> None:
    """Prefill (dynamic, delegated) and decode sharing the cache: 16 greedy
    tokens after prompts of 1, 5 and 8 tokens, equal to eager on both runtimes."""
    model, seq = decoder(), seq_dim()
    step = (torch.zeros(1, 1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    prompt = (torch.zeros(1, 4, dtype=torch.int64), torch.arange(4))
    result = compile_module(model, step,
                            methods={"prefill": (model, prompt, ({1: seq}, {0: seq}))},
                            options=CompileOptions(target="xnnpack"))
    assert "addmm" not in left_out(result, "prefill")
    for length in (1, 5, BOUND):
        tokens = [(7 * i + 3) % VOCAB for i in range(length)]
        expected = eager_tokens(model, tokens, 16)
        assert generate(_on_exirc(result.data), tokens, 16) == expected, length
        assert generate(_on_executorch(result.data), tokens, 16) == expected, length


def _on_exirc(data: bytes) -> Step:
    program = load(data)
    return lambda method, *inputs: program.run(method, list(inputs))[0]


def _on_executorch(data: bytes) -> Step:
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(data)
    methods = {name: program.load_method(name) for name in ("prefill", "forward")}

    def step(method: str, *inputs: torch.Tensor) -> torch.Tensor:
        assert program is not None  # the methods live only as long as their program
        return methods[method].execute(inputs)[0]
    return step


def _reshape_graph(new_shape: list[int]) -> G.XNNGraph:
    graph = G.XNNGraph()
    graph.values = [G.TensorValue(G.Datatype.FP32, [1, 6, 8], 0),
                    G.TensorValue(G.Datatype.FP32, [1, 6, 2, 4], 1)]
    graph.nodes = [G.Node(G.NodeKind.STATIC_RESHAPE, G.StaticReshape(4, new_shape, 0, 1))]
    return graph


def test_reconcile_infers_one_varying_reshape_dim_and_refuses_two() -> None:
    graphs = [_reshape_graph([1, n, 2, 4]) for n in (6, 5, 4)]
    params = reconcile(graphs).nodes[0].params
    assert isinstance(params, G.StaticReshape) and list(params.new_shape) == [1, 0, 2, 4]
    with pytest.raises(SizeMismatch, match="2 dims that vary"):
        reconcile([_reshape_graph([n, n, 2, 4]) for n in (6, 5)])


def test_reconcile_refuses_a_slice_whose_offset_varies() -> None:
    def sliced(offset: int) -> G.XNNGraph:
        graph = G.XNNGraph()
        graph.values = [G.TensorValue(G.Datatype.FP32, [1, 6], 0),
                        G.TensorValue(G.Datatype.FP32, [1, 1], 1)]
        graph.nodes = [G.Node(G.NodeKind.STATIC_SLICE,
                              G.StaticSlice(2, [0, offset], [1, 1], 0, 1))]
        return graph

    with pytest.raises(SizeMismatch, match="offsets depend on a dynamic size"):
        reconcile([sliced(5), sliced(4)])
