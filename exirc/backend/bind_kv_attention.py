"""The ATen-stage pass that binds KV-cache attention to ExecuTorch's LLM ops.

For `--target xnnpack-llm`: each attention call `exirc.backend.kv_match` proves
equal to ExecuTorch's causal `custom_sdpa` over its two caches becomes

    start = item(s)                                      the start position, a SymInt
    k' = exirc::llama_update_cache(k_new^T, k_cache, start); k_cache.copy_(k')
    v' = ...                                             (the same for the value cache)
    out = exirc::llama_custom_sdpa(q^T, k', v', start, None, 0, True, scale)^T

(^T: dims 1 and 2 swapped, [B, H, S, D] <-> [B, S, H, D]), whose out forms are
`llama::update_cache.out` and `llama::custom_sdpa.out` (`exirc.backend.llama_ops`).
ExecuTorch's ops keep the cache as [B, S_max, Hkv, D], so each bound cache's
state is laid out so: its initial value transposed, its placeholder's shape
with it. That is only right if the attention is the cache's one reader and
the write its one writer, which the match requires; a cache used any other
way, or by an attention that is no exact match, stays as it was, decomposed.

The reasons are kept on the method's graph (`exirc.ir.meta.attention_report`),
for the compile summary and `--explain-delegation`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from exirc.backend.kv_match import Binding, CacheRead, NoMatch, is_attention, match
from exirc.backend.llama_ops import custom_sdpa_op, update_cache_op
from exirc.ir.meta import set_attention_report
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.fx import Graph, Node

aten = torch.ops.aten


@dataclass
class AttentionReport:
    """Which attention calls of a method were bound, and why the others were not."""

    bound: list[str] = field(default_factory=list)          # node names
    unbound: list[tuple[str, str]] = field(default_factory=list)  # (node name, reason)
    relaid: set[str] = field(default_factory=set)  # buffers laid out [B, S, H, D]

    def lines(self) -> list[str]:
        total = len(self.bound) + len(self.unbound)
        lines = [f"attention: {len(self.bound)} of {total} calls bound to "
                 "llama::update_cache + llama::custom_sdpa"]
        lines += [f"  %{name} left decomposed: {reason}" for name, reason in self.unbound]
        return lines


def _call(graph: Graph, target: Any, args: tuple[Any, ...], val: Any, like: Node) -> Node:
    node = graph.call_function(target, args)
    node.meta["val"] = val
    for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
        if key in like.meta:
            node.meta[key] = like.meta[key]
    return node


def _swap(graph: Graph, node: Node, like: Node) -> Node:
    value = node.meta["val"].transpose(1, 2)
    return _call(graph, aten.transpose.int, (node, 1, 2), value, like)


def _relayout(program: ExportedProgram, buffer: Node) -> None:
    """The cache's state as [B, S_max, Hkv, D]: its initial value and its placeholder."""
    target = program.graph_signature.inputs_to_buffers[buffer.name]
    store = program.state_dict if target in program.state_dict else program.constants
    store[target] = store[target].transpose(1, 2).contiguous()
    fake = buffer.meta["val"]
    buffer.meta["val"] = fake.new_empty((fake.shape[0], fake.shape[2], fake.shape[1],
                                         fake.shape[3]))


def _start_symbol() -> Any:
    """A SymInt for the item's result. Its own ShapeEnv: a fresh symbol in the
    program's would be pending there, and torch's retrace of the program would
    then look for it among the next op's results."""
    env = ShapeEnv()
    symbol = env.create_unbacked_symint()
    env.pending_fresh_unbacked_symbols.clear()
    return symbol


def _bind_cache(graph: Graph, read: CacheRead, start: Node) -> Node:
    """k_cache.copy_(update_cache(new^T, k_cache, start)) in place of the index_copy_."""
    with graph.inserting_before(read.write):
        rows = _swap(graph, read.new, read.write)
        updated = _call(graph, update_cache_op, (rows, read.buffer, start),
                        read.buffer.meta["val"], read.write)
        written = _call(graph, aten.copy_.default, (read.buffer, updated),
                        read.buffer.meta["val"], read.write)
    return written


def _erase(graph: Graph, read: CacheRead) -> None:
    """The index_copy_ and its repeat, once the attention no longer reads them."""
    for node in (*read.chain, read.write):  # users first
        graph.erase_node(node)


def _bind(program: ExportedProgram, binding: Binding) -> None:
    graph = program.graph
    call = binding.call
    for read in (binding.key, binding.value):
        _relayout(program, read.buffer)
    positions = binding.key.positions  # arange(S) + s: s is its first element
    with graph.inserting_before(binding.key.write):
        first = _call(graph, aten.select.int, (positions, 0, 0),
                      positions.meta["val"][0], call)
        start = _call(graph, aten.item.default, (first,), _start_symbol(), call)
    key = _bind_cache(graph, binding.key, start)
    value = _bind_cache(graph, binding.value, start)
    with graph.inserting_before(call):
        query = _swap(graph, binding.query, call)
        attended = _call(graph, custom_sdpa_op,
                         (query, key, value, start, None, 0.0, True, binding.scale),
                         query.meta["val"], call)
        result = _swap(graph, attended, call)
    call.replace_all_uses_with(result)
    graph.erase_node(call)
    _erase(graph, binding.key)
    _erase(graph, binding.value)


@dataclass(frozen=True)
class BindKvAttention(Pass):
    """ATen -> ATen: each attention call over a KV cache that `kv_match` proves is
    ExecuTorch's causal `custom_sdpa` becomes the stand-ins of `llama::update_cache`
    and `llama::custom_sdpa`, its caches laid out [B, S_max, Hkv, D]; the others
    are left for `to_edge`, with the reason in the method's `attention_report`."""

    name: ClassVar[str] = "bind_kv_attention"

    def run(self, program: ExportedProgram) -> PassResult:
        report = AttentionReport()
        bindings: list[Binding] = []
        order = {node: index for index, node in enumerate(program.graph.nodes)}
        for node in program.graph.nodes:
            if not is_attention(node):
                continue
            try:
                binding = match(node, order, program.range_constraints)
                for read in (binding.key, binding.value):
                    if read.buffer.name not in program.graph_signature.inputs_to_buffers:
                        raise NoMatch(f"the cache {read.buffer.name} is not a buffer")
                bindings.append(binding)
                report.bound.append(node.name)
            except NoMatch as reason:
                report.unbound.append((node.name, str(reason)))
        buffers = program.graph_signature.inputs_to_buffers
        for binding in bindings:
            _bind(program, binding)
            report.relaid |= {buffers[read.buffer.name] for read in (binding.key, binding.value)}
        if report.bound or report.unbound:
            set_attention_report(program.graph_module, report)
        if bindings:  # the mask is left for to_edge's dead code elimination
            program.graph_module.recompile()
        return PassResult(program, bool(bindings))
