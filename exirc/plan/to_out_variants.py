"""Edge/Backend dialect -> out-variant form, the last graph form before emit.

Every kernel call writes into memory it is given: a functional node such as
`aten.add.Tensor(x, y)` becomes `aten.add.out(x, y, out=%alloc)`, where the
`alloc` node stands for one planned tensor. The op node then aliases its
out argument(s), which is what the memory planner and the emitter read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch.fx import GraphModule, Node

from exirc.backend.delegation.lowered import LoweredDelegate
from exirc.backend.ops import BackendOp
from exirc.errors import UnsupportedOperatorError
from exirc.ir.control_flow import (
    MAP,
    WHILE_LOOP,
    is_control_flow,
    output_values,
    placeholders,
    subgraphs,
)
from exirc.ir.source import source_location
from exirc.passes.contract import Pass, PassResult
from exirc.plan.ops import OUT_FORMS, alloc, out_variant, view_base

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def _results(node: Node) -> list[torch.Tensor]:
    value = node.meta["val"]
    results = list(value) if isinstance(value, (list, tuple)) else [value]
    for result in results:
        if not isinstance(result, torch.Tensor):
            where = source_location(node)
            raise UnsupportedOperatorError(
                f"{node.target} at {where or node.name} returns a {type(result).__name__}; "
                "control flow may only produce tensors",
                hint="return sizes and counters as 0-d tensors (torch.tensor(n))")
    return results


def copy_passthrough_results(body: GraphModule) -> None:
    """Make every result of a loop body a tensor of its own.

    The loop copies result k into state k while state j is still to be read
    for result j; a body returning a state, a view of one (see
    `exirc.plan.alias_views`), or one value twice would read a state already
    overwritten, so such results become clones first.
    """
    output = body.graph.output_node()
    seen: set[Node] = set()
    results = output_values(body)
    for i, result in enumerate(results):
        if isinstance(result, Node) and (view_base(result).op == "placeholder" or
                                         result in seen):
            with body.graph.inserting_before(output):
                clone = body.graph.call_function(torch.ops.aten.clone.default, (result,))
            clone.meta.update(val=result.meta["val"], stack_trace=result.meta.get("stack_trace"))
            results[i] = clone
        if isinstance(result, Node):
            seen.add(result)
    output.args = (tuple(results),)
    body.recompile()


def to_out_form(owner: GraphModule, node: Node,
                make_alloc: Callable[[Node, torch.Tensor], Node]) -> None:
    """Rewrite control-flow `node` (of `owner`) into its out form, in place.

    `make_alloc(before, fake)` inserts an alloc node before `before`.
    """
    outs = [make_alloc(node, fake) for fake in _results(node)]
    target = node.target
    if target is MAP:
        body = subgraphs(owner, node)[0]
        xs = list(node.args[1])  # type: ignore[arg-type]
        slice_placeholders = placeholders(body)[:len(xs)]
        slices = [make_alloc(node, p.meta["val"]) for p in slice_placeholders]
        node.args = (*node.args, slices, outs)
    else:
        node.args = (*node.args, outs)
    node.target = OUT_FORMS[target]  # type: ignore[assignment]


def _returns_tensors(target: Any) -> bool:
    return any("Tensor" in str(r.type) for r in target._schema.returns)


def _in_place(target: Any) -> bool:
    """Whether `target` writes into an argument that is not an out (`copy_`)."""
    return any(a.alias_info is not None and a.alias_info.is_write and not a.is_out
               for a in target._schema.arguments)


def out_arguments(target: Any) -> list[torch._C.Argument]:
    return [a for a in target._schema.arguments if a.is_out]


def _passes_outs(node: Node) -> bool:
    """Whether a call already writes into given memory (rewritten before)."""
    return any(a.name in node.kwargs for a in out_arguments(node.target))


def alloc_node(graph: torch.fx.Graph, before: Node, fake: torch.Tensor) -> Node:
    # The argument is for people reading the graph; the planner reads
    # meta["val"]. Symbolic sizes are spelled out, not passed as SymInts.
    shape = tuple(d if isinstance(d, int) else str(d) for d in fake.shape)
    with graph.inserting_before(before):
        node = graph.call_function(alloc, ((shape, fake.dtype),))
    node.meta["val"] = fake
    node.meta["stack_trace"] = before.meta.get("stack_trace")
    return node


def _outputs_of(node: Node) -> list[Any]:
    val = node.meta["val"]
    return list(val) if isinstance(val, (tuple, list)) else [val]


@dataclass(frozen=True)
class ToOutVariants(Pass):
    """Edge/Backend -> out-variant form: kernels write into `alloc` nodes.

    Raises UnsupportedOperatorError naming every op without an out-variant.
    """

    name: ClassVar[str] = "to_out_variants"

    def run(self, program: ExportedProgram) -> PassResult:
        missing: list[str] = []
        changed = self._convert(program.graph_module, missing)
        if missing:
            raise UnsupportedOperatorError(
                "no out-variant for: " + "; ".join(missing),
                hint="every kernel must write into planned memory; decompose the op or "
                     "register a backend op with an out-variant")
        return PassResult(program, changed)

    def _convert(self, module: torch.fx.GraphModule, missing: list[str]) -> bool:
        """Convert `module` and, first, the subgraphs of its control flow."""
        graph = module.graph
        changed = False
        for node in list(graph.nodes):
            target = node.target
            if is_control_flow(node):
                branches = subgraphs(module, node)
                if target is WHILE_LOOP:
                    copy_passthrough_results(branches[1])
                for branch in branches:
                    self._convert(branch, missing)
                to_out_form(module, node, lambda before, fake: alloc_node(graph, before, fake))
                changed = True
                continue
            if isinstance(target, LoweredDelegate):
                self._rewrite_delegate(graph, node, target)
                changed = True
                continue
            if node.op != "call_function" or \
                    not isinstance(target, (torch._ops.OpOverload, BackendOp)):
                continue
            if not _returns_tensors(target) or _passes_outs(node) or _in_place(target):
                # size arithmetic (sym_size, prims) writes Int values; an in-place
                # op (the `copy_` of write_back_state) writes into its argument
                continue
            out_op = out_variant(target)
            if out_op is None:
                where = source_location(node)
                missing.append(f"{target} (node {node.name}{', at ' + where if where else ''})")
                continue
            self._rewrite(graph, node, out_op)
            changed = True
        if changed:
            module.recompile()
        return changed

    @staticmethod
    def _rewrite_delegate(graph: torch.fx.Graph, node: Node, delegate: LoweredDelegate) -> None:
        """A delegate call writes its results into planned tensors, as kernels do."""
        outs = [alloc_node(graph, node, fake) for fake in _outputs_of(node)]
        node.target = delegate.out_form
        node.args = (list(node.args),)
        node.kwargs = {"out": outs}

    @staticmethod
    def _rewrite(graph: torch.fx.Graph, node: Node, out_op: Any) -> None:
        fakes = _outputs_of(node)
        kwargs = dict(node.kwargs)
        outs = out_arguments(out_op)
        if len(outs) == 1 and str(outs[0].type) == "List[Tensor]":
            kwargs[outs[0].name] = [alloc_node(graph, node, f) for f in fakes]
        elif len(outs) == len(fakes):
            for arg, fake in zip(outs, fakes):
                kwargs[arg.name] = alloc_node(graph, node, fake)
        else:
            raise UnsupportedOperatorError(
                f"{out_op} has {len(outs)} out arguments but the node {node.name} makes "
                f"{len(fakes)} outputs", hint="this op needs a hand-written out-variant rule")
        node.target = out_op
        node.kwargs = kwargs
