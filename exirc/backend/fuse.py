"""Fusion: replace subgraphs matching a backend op's pattern with the op.

The pattern is traced with torch.fx, and each occurrence in the graph is
found by walking back from the pattern's output: same targets, same
constant arguments, placeholders bound consistently, and no intermediate
value used outside the match (else fusing would compute it twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch.fx import Graph, Node

from exirc.backend.ops import BackendOp, addmm_relu
from exirc.errors import UsageError
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram

FUSIONS: dict[str, BackendOp] = {"linear_relu": addmm_relu}


def pattern_graph(op: BackendOp) -> Graph:
    """The pattern of `op` as a graph: what a retrace of the op recovers."""
    return torch.fx.symbolic_trace(op.pattern).graph


def _pattern_output(graph: Graph) -> Node:
    (output,) = [n for n in graph.nodes if n.op == "output"]
    result = output.args[0]
    assert isinstance(result, Node)
    return result


def match(pattern: Graph, anchor: Node) -> dict[Node, Node] | None:
    """Pattern node -> graph node, if the pattern's output matches at `anchor`."""
    bound: dict[Node, Node] = {}

    def same(p: Any, g: Any) -> bool:
        if isinstance(p, Node):
            return isinstance(g, Node) and visit(p, g)
        if isinstance(p, (list, tuple)):
            return isinstance(g, (list, tuple)) and len(p) == len(g) and \
                all(same(a, b) for a, b in zip(p, g))
        return bool(p == g)

    def visit(p: Node, g: Node) -> bool:
        if p in bound:
            return bound[p] is g
        if p.op == "placeholder":
            bound[p] = g
            return True
        if g.op != "call_function" or p.target != g.target or len(p.args) != len(g.args) \
                or set(p.kwargs) != set(g.kwargs):
            return False
        bound[p] = g
        return all(same(a, b) for a, b in zip(p.args, g.args)) and \
            all(same(p.kwargs[k], g.kwargs[k]) for k in p.kwargs)

    if not visit(_pattern_output(pattern), anchor):
        return None
    inner = {g for p, g in bound.items() if p.op != "placeholder" and g is not anchor}
    for node in inner:
        if any(user not in inner and user is not anchor for user in node.users):
            return None
    return bound


@dataclass(frozen=True)
class Fuse(Pass):
    """Edge/Backend -> Backend: each match of a named pattern becomes its op."""

    name: ClassVar[str] = "fuse"
    patterns: tuple[str, ...] = ("linear_relu",)

    def run(self, program: ExportedProgram) -> PassResult:
        unknown = set(self.patterns) - set(FUSIONS)
        if unknown:
            raise UsageError(f"unknown fusion pattern(s) {sorted(unknown)}",
                             hint=f"known: {', '.join(sorted(FUSIONS))}")
        graph = program.graph_module.graph
        changed = False
        for name in self.patterns:
            op = FUSIONS[name]
            pattern = pattern_graph(op)
            inputs = [n for n in pattern.nodes if n.op == "placeholder"]
            for anchor in list(graph.nodes):
                if anchor.op != "call_function":
                    continue
                bound = match(pattern, anchor)
                if bound is None:
                    continue
                with graph.inserting_before(anchor):
                    fused = graph.call_function(op, tuple(bound[p] for p in inputs))
                fused.meta.update(anchor.meta)
                anchor.replace_all_uses_with(fused)
                changed = True
            if changed:
                graph.eliminate_dead_code()
        if changed:
            program.graph_module.recompile()
        return PassResult(program, changed)
