"""Cache writes in place: `exirc::llama_update_cache` becomes `llama::update_cache.out`.

The stand-in is functional (it returns the updated cache, which
`write_back_state` then copies into the state), but ExecuTorch's op writes
the rows into the cache it is given and its out is a one-element placeholder.
Where the state's old value has no reader but the write, writing into the
state itself is the same program without the copy of the whole cache, twice.
Elsewhere (a pipeline that bound a cache some other read also sees) the write
goes into a copy of the cache, which is always right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from exirc.backend.llama_ops import update_cache_op, update_cache_out
from exirc.ir.meta import state_slot
from exirc.passes.contract import Pass, PassResult
from exirc.plan.to_out_variants import alloc_node

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.fx import Node

aten = torch.ops.aten


def _results(update: Node, cache: Node) -> list[Node]:
    """The update and the functional copies of it over the cache (the same value)."""
    found = [update]
    for node in found:
        found += [user for user in node.users if user.op == "call_function" and
                  user.target is aten.copy.default and user.args == (cache, node)]
    return found


def _state_writes(cache: Node, results: list[Node]) -> list[Node]:
    return [user for user in cache.users if user.op == "call_function" and
            user.target is aten.copy_.default and user.args[0] is cache and
            user.args[1] in results]


def _in_place(update: Node) -> bool:
    """Write into the state: its only other uses are copies of the result into it."""
    cache = update.args[1]
    if not isinstance(cache, torch.fx.Node) or cache.op != "placeholder" or \
            state_slot(cache) is None:
        return False
    results = _results(update, cache)
    others = set(cache.users) - set(results) - set(_state_writes(cache, results))
    return not others


@dataclass(frozen=True)
class UpdateCachesInPlace(Pass):
    """Plan (after write_back_state) -> Plan: each `exirc::llama_update_cache` becomes
    `llama::update_cache.out` writing into the state (or into a copy of it where
    the old value is read too), its readers reading what it wrote."""

    name: ClassVar[str] = "update_caches_in_place"

    def run(self, program: ExportedProgram) -> PassResult:
        graph = program.graph
        updates = [n for n in graph.nodes
                   if n.op == "call_function" and n.target is update_cache_op]
        for update in updates:
            cache = update.args[1]
            assert isinstance(cache, torch.fx.Node)
            if _in_place(update):
                results = _results(update, cache)
                for write in _state_writes(cache, results):
                    graph.erase_node(write)
                target = cache
            else:
                with graph.inserting_before(update):
                    target = graph.call_function(aten.clone.default, (cache,))
                target.meta["val"] = cache.meta["val"]
                results = [update]
            for result in reversed(results):
                result.replace_all_uses_with(target)
                if result is not update:
                    graph.erase_node(result)
            dummy = update.meta["val"].new_empty((1,))
            update.target = update_cache_out
            update.args = (update.args[0], target, update.args[2])
            update.kwargs = {"out": alloc_node(graph, update, dummy)}
            update.meta["val"] = dummy
        if updates:
            program.graph_module.recompile()
        return PassResult(program, bool(updates))
