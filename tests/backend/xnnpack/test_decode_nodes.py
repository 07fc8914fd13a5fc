"""Fewer XNNPACK nodes in a decoder's step, the same results bit for bit (issue 33).

On ExecuTorch's runtime a decode step of a small model is mostly per-node
cost (about 0.1 us a node), so three rewrites cut nodes without changing a value:

- `merge_rotary`: the queries' and keys' rotary chains (six nodes each) joined
  on the heads axis, rotated once, sliced apart;
- `merge_projections`: two quantized projections of one input that only that
  join reads, one fully connected node with both filters' rows;
- `remake_shared_views`: a reshape of a delegate's input that a later delegate
  reads (the RoPE tables' `unsqueeze`) is remade there instead of being an
  output of the first.

Each file is compared with the one made without them ("before": all
switched off), on exirc's runtime and on ExecuTorch's: equal, bit for bit.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.export import Dim

from exirc.compiler import CompileOptions, compile_model, compile_module
from exirc.inspector.delegates import program_payloads
from exirc.runtime import load
from exirc.serialize.reader import deserialize
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.reader import deserialize_blob
from tests.oracle import executorch_method, requires_executorch

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
BOUND, WIDTH, HEAD_DIM = 8, 32, 8


class QkRotary(nn.Module):
    """A layer's query and key projections, rotated as LLaMA's RoPE (the sign of
    rotate_half's negated half in `sin`, as lookup_tables makes the tables)."""

    def __init__(self, per_head_tables: bool = False, twice: bool = False) -> None:
        super().__init__()
        self.twice = twice  # the queries rotated again: a chain reading another's result
        kv_heads = 4 if per_head_tables else 2
        self.q = nn.Linear(WIDTH, 4 * HEAD_DIM, bias=False)
        self.k = nn.Linear(WIDTH, kv_heads * HEAD_DIM, bias=False)
        self.per_head_tables = per_head_tables

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        q = self.q(x).view(1, x.shape[1], -1, HEAD_DIM)
        k = self.k(x).view(1, x.shape[1], -1, HEAD_DIM)
        if self.per_head_tables:  # a table per head: joining heads would misplace them
            cos, sin = cos * torch.ones(4, 1), sin * torch.ones(4, 1)
        else:
            cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
        q = _rotate(q, cos, sin)
        return _rotate(q, cos, sin) if self.twice else q, _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), -1) * sin


def _inputs(length: int, tables: int = 1) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(length)
    shape = (1, length, tables, HEAD_DIM) if tables > 1 else (1, length, HEAD_DIM)
    return (torch.randn(1, length, WIDTH, generator=g), torch.randn(*shape, generator=g),
            torch.randn(*shape, generator=g))


@pytest.fixture
def before(monkeypatch: pytest.MonkeyPatch) -> Callable[[], Any]:
    """A context in which files are made as before the two rewrites."""
    def switch_off() -> Any:
        patch = pytest.MonkeyPatch()
        patch.setattr("exirc.backend.xnnpack.serializer.merge_rotary", lambda graph: 0)
        patch.setattr("exirc.backend.xnnpack.serializer.merge_projections",
                      lambda graph, named_data: 0)
        patch.setattr("exirc.backend.delegate.remake_shared_views", lambda partitions: 0)
        return patch
    return switch_off


def _graphs(data: bytes) -> list[G.XNNGraph]:
    return [deserialize_blob(p.data).graph for p in program_payloads(deserialize(data))]


def _kinds(graph: G.XNNGraph) -> list[str]:
    return [n.kind.name for n in graph.nodes]


def _qk(per_head_tables: bool = False, mode: str | None = None, twice: bool = False) -> bytes:
    torch.manual_seed(5)
    tables = 4 if per_head_tables else 1
    seq = Dim("seq", min=1, max=BOUND)
    quantized = {"quantize": mode, "min_sqnr_db": 0.0} if mode else {}
    return compile_module(QkRotary(per_head_tables, twice).eval(), _inputs(3, tables),
                          dynamic_shapes=({1: seq}, {1: seq}, {1: seq}),
                          options=CompileOptions(target="xnnpack", **quantized)).data


_made: dict[Any, tuple[bytes, bytes]] = {}  # the runtimes' tests of one model share its files


def _both(before: Callable[[], Any], make: Callable[..., bytes], **arguments: Any
          ) -> tuple[bytes, bytes]:
    """`make(**arguments)` without the rewrites and with them, made once per module for
    each set of arguments (defaults filled in, so equal calls share the files)."""
    bound = inspect.signature(make).bind(**arguments)
    bound.apply_defaults()
    key = (make, tuple(bound.arguments.items()))
    if key not in _made:
        patch = before()
        try:
            old = make(**arguments)
        finally:
            patch.undo()
        _made[key] = old, make(**arguments)
    return _made[key]


def test_queries_and_keys_are_rotated_by_one_chain(before: Callable[[], Any]) -> None:
    old, new = _both(before, _qk)
    (was,), (now,) = _graphs(old), _graphs(new)
    assert _kinds(was).count("MULTIPLY") == 4 and _kinds(was).count("ADD") == 2
    # Two chains of six and the two projections' head reshapes (14 nodes)
    # become a concatenate of the projections, one reshape, one chain and a
    # slice back to each (10 nodes).
    assert _kinds(now).count("MULTIPLY") == 2 and _kinds(now).count("ADD") == 1
    assert _kinds(now).count("STATIC_RESHAPE") == _kinds(was).count("STATIC_RESHAPE") - 1
    assert len(now.nodes) == len(was.nodes) - 4


@pytest.mark.parametrize("mode", ["8da4w", "8da8w"])
def test_quantized_projections_joined_anyway_are_one_fully_connected_node(
        before: Callable[[], Any], mode: str) -> None:
    old, new = _both(before, _qk, mode=mode)
    (was,), (now,) = _graphs(old), _graphs(new)
    assert _kinds(was).count("FULLY_CONNECTED") == 2
    # The two projections, the concatenate joining them: one node with both
    # filters' rows (and scales), 4 * 8 + 2 * 8 outputs.
    fc = [n for n in now.nodes if n.kind == G.NodeKind.FULLY_CONNECTED]
    assert len(fc) == 1 and _kinds(now).count("CONCATENATE2") == 1  # rotate_half's own
    assert now.values[fc[0].params.filter_id].dims == [6 * HEAD_DIM, WIDTH]  # type: ignore[union-attr]
    assert len(now.nodes) == len(was.nodes) - 6


def test_tables_of_every_head_keep_their_chains(before: Callable[[], Any]) -> None:
    old, new = _both(before, _qk, per_head_tables=True)
    assert [_kinds(g) for g in _graphs(new)] == [_kinds(g) for g in _graphs(old)]


RUNTIMES = ["exirc", pytest.param("executorch", marks=[requires_executorch, pytest.mark.oracle])]


def _method(data: bytes, runtime: str) -> Callable[[list[Any]], Any]:
    if runtime == "exirc":
        return load(data).method("forward").run
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401 (its llama kernels)

    return executorch_method(data)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize(("per_head_tables", "mode", "twice"),
                         [(False, None, False), (True, None, False), (False, None, True),
                          (False, "8da4w", False), (False, "8da8w", False)])
def test_every_length_gives_the_results_of_before_bit_for_bit(
        before: Callable[[], Any], per_head_tables: bool, mode: str | None, twice: bool,
        runtime: str) -> None:
    old, new = _both(before, _qk, per_head_tables=per_head_tables, mode=mode, twice=twice)
    if twice:  # the second rotation joins the keys' (the first's result is made by then)
        assert [_kinds(g).count("ADD") for g in _graphs(new)] == [2]
    run_old, run_new = _method(old, runtime), _method(new, runtime)
    torch.manual_seed(5)
    eager = QkRotary(per_head_tables, twice).eval()
    for length in range(1, BOUND + 1):
        inputs = list(_inputs(length, 4 if per_head_tables else 1))
        got, want = run_new(inputs), run_old(inputs)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), length
        if mode is None:  # the quantized files: equal to before is the claim
            with torch.no_grad():
                expected = eager(*inputs)
            assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, expected)), length


# --------------------------------------------------------------------------
# examples/tiny_llm.py under --target xnnpack-llm
# --------------------------------------------------------------------------


@functools.cache
def _tiny_llm_module() -> Any:
    spec = importlib.util.spec_from_file_location("example_tiny_llm", EXAMPLES / "tiny_llm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tiny_llm(mode: str | None) -> bytes:
    options = CompileOptions(target="xnnpack-llm", quantize=mode,
                             **({"min_sqnr_db": 0.0} if mode else {}))
    return compile_model(str(EXAMPLES / "tiny_llm.py"), options, warn=lambda _: None).data


def _decode(run: Callable[[list[Any]], Any]) -> list[torch.Tensor]:
    """A 16-token prompt, then 16 greedy steps: every call's logits."""
    logits = [run([torch.arange(3, 19).reshape(1, 16), torch.arange(16)])[0].clone()]
    for position in range(16, 32):
        token = int(logits[-1][0, -1].argmax())
        logits.append(run([torch.tensor([[token]]), torch.tensor([position])])[0].clone())
    return logits


NODES = {  # per delegate: before, after
    None: ([33, 56, 36], [27, 52, 36]),
    "8da4w": ([31, 50, 31], [23, 44, 31]),
    "8da8w": ([31, 50, 31], [23, 44, 31]),
}


@pytest.mark.slow
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("mode", list(NODES))
def test_tiny_llm_steps_have_fewer_nodes_and_the_same_logits(
        before: Callable[[], Any], mode: str | None, runtime: str) -> None:
    old, new = _both(before, _tiny_llm, mode=mode)
    was, now = _graphs(old), _graphs(new)
    assert ([len(g.nodes) for g in was], [len(g.nodes) for g in now]) == NODES[mode]
    # The first delegate no longer hands the RoPE tables' views on (cos, sin).
    assert len(now[0].output_ids) == len(was[0].output_ids) - 2
    old_logits = _decode(_method(old, runtime))
    assert all(torch.equal(a, b) for a, b in zip(_decode(_method(new, runtime)), old_logits))
