"""SymInt prims: size arithmetic as kernels the runtime can run.

torch.export leaves Python `operator.*` calls on SymInts in the graph (e.g.
`sym_size(x, 0) * 2` for a reshape under a dynamic batch). The runtime
cannot call Python, so each becomes an `executorch_prim::*` op whose pattern
is the very operator it replaces.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch.fx import Node

from exirc.backend.ops import BackendOp, bind_pattern_to_op
from exirc.ir.rewrite import Answer, rewrite_nodes
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def _prim(name: str, fn: Any, returns: str = "Scalar", arity: int = 2) -> BackendOp:
    params = "Scalar a, Scalar b" if arity == 2 else "Scalar a"
    return bind_pattern_to_op(f"executorch_prim::{name}({params}) -> {returns}")(fn)


PRIMS: dict[Any, BackendOp] = {
    operator.add: _prim("add.Scalar", operator.add),
    operator.sub: _prim("sub.Scalar", operator.sub),
    operator.mul: _prim("mul.Scalar", operator.mul),
    operator.floordiv: _prim("floordiv.Scalar", operator.floordiv),
    operator.truediv: _prim("truediv.Scalar", operator.truediv),
    operator.mod: _prim("mod.Scalar", operator.mod),
    operator.eq: _prim("eq.Scalar", operator.eq, "bool"),
    operator.gt: _prim("gt.Scalar", operator.gt, "bool"),
    operator.lt: _prim("lt.Scalar", operator.lt, "bool"),
    operator.ge: _prim("ge.Scalar", operator.ge, "bool"),
    operator.le: _prim("le.Scalar", operator.le, "bool"),
    operator.neg: _prim("neg.Scalar", operator.neg, arity=1),
    torch.sym_float: _prim("sym_float.Scalar", float, "float", arity=1),
    torch.sym_max: _prim("sym_max.Scalar", max),
    torch.sym_min: _prim("sym_min.Scalar", min),
    torch.sym_int: _prim("sym_int.Scalar", int, "int", arity=1),
    torch.sym_not: _prim("sym_not.Scalar", operator.not_, "bool", arity=1),
    math.ceil: _prim("ceil.Scalar", math.ceil, "int", arity=1),
    math.trunc: _prim("trunc.Scalar", math.trunc, "int", arity=1),
    round: _prim("round.Scalar", round, "int", arity=1),
}

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


@dataclass(frozen=True)
class SymPrims(Pass):
    """Edge -> Backend: Python operators on SymInts become executorch_prim ops."""

    name: ClassVar[str] = "sym_prims"

    def run(self, program: ExportedProgram) -> PassResult:
        return PassResult(program, rewrite_nodes(program.graph_module, _to_prim))


def _to_prim(node: Node) -> Answer:
    if node.target not in PRIMS or not isinstance(node.meta.get("val"), _SYMBOLIC):
        return None
    node.target = PRIMS[node.target]
    return node
