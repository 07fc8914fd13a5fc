"""The Edge dialect verifier, run after the edge stage.

Rules: every call is an Edge op (see `ops.py`); no node outputs a Python
scalar except size queries (the Edge spec keeps scalars off the graph's
edges so every value has a dtype); and every op's dtypes satisfy its
constraints in `dtype_constraints.yaml`.

Ops outside the Edge op set are of two kinds, reported differently:

  * the model's own: a custom op, or an ATen op that `to_edge` cannot
    decompose into core ATen. The dialect admits them as the model calls
    them (the Edge spec admits registered custom ops) when the target or a
    plugin has a kernel for them; otherwise the model cannot run here, and
    `OperatorNotSupportedError` (E0401, exit code 4) tells its author which
    op, where, and to register a kernel or change the model.
  * a pass's: anything else (a view, an op `to_edge` does decompose) means a
    pass or pipeline is wrong, a `DialectError` (E0330) for pass writers.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import torch

from exirc.edge.ops import SIZE_OPS, is_edge_op
from exirc.errors import DialectError
from exirc.ir.control_flow import all_nodes, is_control_flow
from exirc.ir.source import describe_node

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def verify_edge(program: ExportedProgram, kept: Collection[Any] = frozenset()) -> None:
    """Check an Edge graph. `kept` are the ops outside the Edge op set that the
    target runs as the model calls them: the compiler finds them with
    `exirc.plan.kernels.check_kept_operators`, which also raises E0401 for such
    ops no kernel runs, before this check."""
    graph_module = program.graph_module
    for node in all_nodes(graph_module):
        if node.op != "call_function" or is_control_flow(node):
            continue
        # Python arithmetic on SymInts (sizes under dynamic shapes) stays until the
        # backend's sym_prims pass; the Backend verifier rejects what is left of it.
        size_arithmetic = not isinstance(node.target, torch._ops.OpOverload) and \
            isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))
        if not is_edge_op(node.target) and not size_arithmetic and node.target not in kept:
            raise DialectError(f"{describe_node(node)} is not an Edge op",
                               hint=_not_edge_hint(node.target))
        value = node.meta.get("val")
        if isinstance(value, (int, float, bool)) and not isinstance(value, torch.SymInt) and \
                isinstance(node.target, torch._ops.OpOverload) and \
                node.target._schema.name not in SIZE_OPS:
            raise DialectError(f"{describe_node(node)} outputs a Python scalar",
                               hint="Edge ops produce tensors; keep the value a 0-d tensor")
    from exirc.edge.dtypes import verify_dtypes

    verify_dtypes(graph_module, skip=kept)  # a kept op's kernel decides its dtypes


def _not_edge_hint(target: object) -> str:
    """What a pass writer can do about a node the Edge dialect does not admit."""
    if isinstance(target, torch._ops.OpOverload) and target.is_view:
        return ("views become copies in the views_to_copies pass: run it after to_edge and "
                "after any pass that makes views")
    if isinstance(target, torch._ops.OpOverload):
        return ("the to_edge pass decomposes it into core ATen ops: run to_edge before, and "
                "check that no later pass made this node (`exirc compile "
                "--print-ir-after-all`)")
    return ("the Edge dialect admits core ATen ops, custom ops and control flow; a pass "
            "made this call: `exirc compile --print-ir-after-all` shows which")
