"""lookup_tables: RoPE's cos and sin of bounded cache positions become gathered tables.

`Rotary` is `kv_models`' attention with transformers' LLaMA rotary embedding
on its queries and keys (cos and sin computed from the positions on every
call). Under `--target xnnpack-llm` its cache write is `llama_update_cache` at
the positions' first, which bounds every position to [0, MAX): the tables hold
the values eager computes, bit for bit (sin's first half negated, taking
rotate_half's negations), and the compiled program gives eager's results call
after call to the cache's end. Positions nothing bounds, values
that mix positions and tables over the size cap are left alone.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.export import ExportedProgram

from exirc.compiler import CompileOptions, compile_module
from exirc.edge.constants import constant_tensor
from exirc.edge.lookup_tables import LookupTables
from exirc.edge.verify import verify_edge
from exirc.pipelines import load_pipeline
from exirc.runtime import load
from exirc.runtime.errors import ExecutionError
from tests.backend import kv_models
from tests.oracle import requires_executorch

aten = torch.ops.aten
MAX, HEADS, HEAD_DIM = kv_models.MAX_SEQ, kv_models.HEADS, kv_models.HEAD_DIM
SCALING = 0.75  # transformers' attention_scaling, here not 1


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """As transformers' LlamaRotaryEmbedding: [1, S, HEAD_DIM] each."""
    freqs = positions[None, :, None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * SCALING, emb.sin() * SCALING


class Rotary(kv_models.KvAttention):
    """`kv_models.KvAttention` with rotary queries and keys (MHA, an exact match)."""

    def __init__(self, mix: bool = False, sin_read: bool = False) -> None:
        super().__init__()
        self.mix = mix  # cos of a value that mixes positions (an outer product)
        self.sin_read = sin_read  # sin read by more than the rotations
        inv_freq = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        positions = input_pos[0] + torch.arange(length)
        cos, sin = cos_sin(positions, self.inv_freq)
        if self.mix:
            outer = (positions[:, None] * positions[None, :]).float()
            cos = cos + outer.cos().sum(-1)[None, :, None]
        q = self.q(x).view(1, length, HEADS, HEAD_DIM).transpose(1, 2)
        k, v = (t.view(1, length, HEADS, HEAD_DIM).transpose(1, 2)
                for t in self.kv(x).chunk(2, dim=-1))
        q = q * cos[:, None] + _rotate_half(q) * sin[:, None]
        k = k * cos[:, None] + _rotate_half(k) * sin[:, None]
        keys = self.k_cache.index_copy_(2, positions, k)
        values = self.v_cache.index_copy_(2, positions, v)
        mask = torch.arange(MAX)[None, :] <= positions[:, None]
        attended = F.scaled_dot_product_attention(q, keys, values, mask)
        result = self.out(attended.transpose(1, 2).reshape(1, length, HEADS * HEAD_DIM))
        return result + sin.sum() if self.sin_read else result


def _model(mix: bool = False, sin_read: bool = False) -> Rotary:
    torch.manual_seed(3)
    return Rotary(mix, sin_read).eval()


def _edge(model: torch.nn.Module, target: str = "xnnpack-llm", length: int = 3
          ) -> ExportedProgram:
    """The program as the target's pipeline has it just before lookup_tables."""
    program = torch.export.export(model, kv_models.inputs(length, 0), strict=False)
    pipeline = load_pipeline(target)
    for p in [*pipeline.stages["aten"], *pipeline.stages["edge"]]:
        if p.name == "lookup_tables" or p.name == "constant_fold":
            break
        program = p.run(program).program
    return program


def _tables(program: ExportedProgram) -> list[tuple[torch.Tensor, Any]]:
    """(table, its gather) for every embedding of a table the pass made."""
    found = []
    for node in program.graph_module.graph.nodes:
        if node.target is aten.embedding.default and node.args[0].name.startswith("_table_"):
            found.append((constant_tensor(program, node.args[0]), node))
    return found


def _targets(program: ExportedProgram) -> list[Any]:
    return [n.target for n in program.graph_module.graph.nodes if n.op == "call_function"]


def test_cos_and_sin_become_tables_holding_eagers_values_bit_for_bit() -> None:
    model = _model()
    program = _edge(model)
    assert aten.cos.default in _targets(program)

    result = LookupTables().run(program)

    assert result.changed
    program = result.program
    targets = _targets(program)
    assert aten.cos.default not in targets and aten.sin.default not in targets
    tables = _tables(program)
    assert [tuple(table.shape) for table, _ in tables] == [(MAX, HEAD_DIM)] * 2
    # Each row is what eager computes for that position, in a call of one token
    # and in a call of the whole cache; sin's first half negated, as each reader
    # multiplies it by rotate_half's cat([-b, a]), whose negations are gone.
    assert aten.neg.default not in targets
    everything = cos_sin(torch.arange(MAX), model.inv_freq)
    signs = torch.ones(2, HEAD_DIM)
    signs[1, :HEAD_DIM // 2] = -1
    for position in range(MAX):
        alone = cos_sin(torch.tensor([position]), model.inv_freq)
        for (table, _), want, whole, sign in zip(tables, alone, everything, signs):
            assert torch.equal(table[position], want[0, 0] * sign)
            assert torch.equal(table[position], whole[0, position] * sign)
    verify_edge(program, kept={torch.ops.exirc.llama_update_cache.default,
                               torch.ops.exirc.llama_custom_sdpa.default})


@pytest.mark.parametrize("length", [1, 3])
def test_the_compiled_program_gives_eagers_results_to_the_caches_end(length: int) -> None:
    model = _model()
    result = compile_module(model, kv_models.inputs(length, 0),
                            options=CompileOptions(target="xnnpack-llm"))
    operators = {op.qualified_name for op in result.program.execution_plan[0].operators}
    assert "aten::embedding.out" in operators and "llama::update_cache.out" in operators
    program, eager = load(result.data), copy.deepcopy(model)
    starts = [*range(0, MAX - length, length), MAX - length]
    with torch.no_grad():
        for start in starts:
            inputs = kv_models.inputs(length, start)
            (got,) = program.run("forward", list(inputs))
            torch.testing.assert_close(got, eager(*inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("position", [MAX, -1])
def test_a_position_outside_the_cache_is_an_error_not_a_read_outside_the_table(
        position: int) -> None:
    model = _model()
    result = compile_module(model, kv_models.inputs(1, 0),
                            options=CompileOptions(target="xnnpack-llm"))
    program = load(result.data)
    x, _ = kv_models.inputs(1, 0)
    with pytest.raises(ExecutionError, match="embedding"):  # the gather checks first
        program.run("forward", [x, torch.tensor([position])])


@requires_executorch
@pytest.mark.oracle
def test_executorch_runs_the_tables_and_refuses_a_position_outside_the_cache() -> None:
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401 (its llama kernels)

    from tests.oracle import executorch_method

    model = _model()
    result = compile_module(model, kv_models.inputs(1, 0),
                            options=CompileOptions(target="xnnpack-llm"))
    method, eager = executorch_method(result.data), copy.deepcopy(model)
    with torch.no_grad():
        for start in range(MAX):
            inputs = kv_models.inputs(1, start)
            got = method(list(inputs))
            got = got[0] if isinstance(got, (list, tuple)) else got
            torch.testing.assert_close(got, eager(*inputs), rtol=1e-5, atol=1e-5)
    x, _ = kv_models.inputs(1, 0)
    for position in (MAX, -1):  # its embedding kernel checks both ends
        with pytest.raises(RuntimeError):
            method([x, torch.tensor([position])])


def test_positions_no_cache_write_bounds_are_left_alone() -> None:
    # --target xnnpack writes the cache with index_put, which takes negative
    # positions too (counting from the end): no bound a table could cover.
    program = _edge(_model(), target="xnnpack")
    assert aten.index_put.default in _targets(program)
    result = LookupTables().run(program)
    assert not result.changed and aten.cos.default in _targets(result.program)


def test_a_value_that_mixes_positions_stays_computed() -> None:
    program = _edge(_model(mix=True))
    result = LookupTables().run(program)
    # cos and sin are tables still; the cos of the outer product of the positions
    # (each row reads every position) is computed, from the positions.
    assert result.changed and len(_tables(result.program)) == 2
    (cos,) = [n for n in result.program.graph_module.graph.nodes
              if n.target is aten.cos.default]
    assert cos.args[0].target is aten._to_copy.default
    assert cos.args[0].args[0].target is aten.mul.Tensor


def test_a_table_read_by_more_than_rotations_keeps_its_signs() -> None:
    model = _model(sin_read=True)
    result = LookupTables().run(_edge(model))
    tables = _tables(result.program)
    assert len(tables) == 2
    assert sum(n.target is aten.neg.default for n in result.program.graph_module.graph.nodes) \
        == 2  # rotate_half's, of q and of k
    _, sin = cos_sin(torch.arange(MAX), model.inv_freq)
    assert torch.equal(tables[1][0], sin[0])


@pytest.mark.parametrize("slack", [0, -1])
def test_tables_over_max_bytes_are_left_alone(slack: int) -> None:
    size = MAX * HEAD_DIM * 4  # cos's and sin's tables
    result = LookupTables(max_bytes=size + slack).run(_edge(_model()))
    tables = [table for table, _ in _tables(result.program)]
    assert result.changed and all(table.nbytes <= size + slack for table in tables)
    computed = aten.cos.default in _targets(result.program)
    # Under the cap, what cos and sin are computed from (positions * inv_freq,
    # half their width) is the table instead.
    assert computed == (slack < 0) and [t.shape[1] for t in tables] == \
        ([HEAD_DIM // 2] if slack < 0 else [HEAD_DIM] * 2)
