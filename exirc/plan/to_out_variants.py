"""Edge/Backend dialect -> out-variant form, the last graph form before emit.

Every kernel call writes into memory it is given: a functional node such as
`aten.add.Tensor(x, y)` becomes `aten.add.out(x, y, out=%alloc)`, where the
`alloc` node stands for one planned tensor. The op node then aliases its
out argument(s), which is what the memory planner and the emitter read.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch.fx import Node

from exirc.backend.ops import BackendOp
from exirc.edge.ops import is_custom_op
from exirc.errors import UnsupportedOperatorError
from exirc.ir.control_flow import WHILE_LOOP, is_control_flow, subgraphs
from exirc.ir.source import source_location
from exirc.passes.contract import Pass, PassResult
from exirc.plan.alloc import alloc
from exirc.plan.control_flow import copy_passthrough_results, to_out_form
from exirc.plan.functional_ops import functional_call

if TYPE_CHECKING:
    from torch.export import ExportedProgram


# Where a tensor is made and how it is laid out: an out-variant takes none of
# these, because the out tensor it is given already decides them.
_TENSOR_OPTIONS = frozenset({"dtype", "layout", "device", "pin_memory"})


def _signature(schema: torch._C.FunctionSchema) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments
            if not a.is_out and a.name not in _TENSOR_OPTIONS]


def out_variant(target: Any) -> Any:
    """The out-variant of a call target, or None if it has none.

    A backend op carries its out-variant schema, so it is its own. A custom
    op with no out overload is called functionally into planned memory
    (`exirc.plan.functional_ops`).
    """
    if isinstance(target, BackendOp):
        return target if target.out_names else None
    found = _aten_out_variant(target)
    if found is None and is_custom_op(target):
        return functional_call(target)
    return found


@functools.cache
def _aten_out_variant(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The overload of `op`'s packet taking the same arguments plus outs."""
    if any(a.is_out for a in op._schema.arguments):
        return op  # already an out-variant
    wanted = _signature(op._schema)
    packet = op.overloadpacket
    for name in packet.overloads():
        candidate = getattr(packet, name)
        schema = candidate._schema
        if any(a.is_out for a in schema.arguments) and _signature(schema) == wanted:
            return candidate
    return None


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


def _alloc_node(graph: torch.fx.Graph, before: Node, fake: torch.Tensor) -> Node:
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
                to_out_form(module, node, lambda before, fake: _alloc_node(graph, before, fake))
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
    def _rewrite(graph: torch.fx.Graph, node: Node, out_op: Any) -> None:
        fakes = _outputs_of(node)
        kwargs = dict(node.kwargs)
        outs = out_arguments(out_op)
        if len(outs) == 1 and str(outs[0].type) == "List[Tensor]":
            kwargs[outs[0].name] = [_alloc_node(graph, node, f) for f in fakes]
        elif len(outs) == len(fakes):
            for arg, fake in zip(outs, fakes):
                kwargs[arg.name] = _alloc_node(graph, node, fake)
        else:
            raise UnsupportedOperatorError(
                f"{out_op} has {len(outs)} out arguments but the node {node.name} makes "
                f"{len(fakes)} outputs", hint="this op needs a hand-written out-variant rule")
        node.target = out_op
        node.kwargs = kwargs
