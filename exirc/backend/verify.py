"""The Backend dialect verifier: Edge ops plus registered backend ops only.

Python operators left on SymInts are errors here: the runtime cannot call
Python, so the sym_prims pass must have turned them into prim ops.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from exirc.backend.delegation.lowered import LoweredDelegate
from exirc.backend.ops import BackendOp
from exirc.edge.ops import is_edge_op
from exirc.errors import DialectError
from exirc.ir.control_flow import all_nodes, is_control_flow
from exirc.ir.source import describe_node

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def verify_backend(program: ExportedProgram, kept: Collection[Any] = frozenset()) -> None:
    """Check a Backend graph; `kept` ops outside the Edge op set pass as in `verify_edge`."""
    for node in all_nodes(program.graph_module):
        if node.op != "call_function" or is_control_flow(node):
            continue
        if isinstance(node.target, (BackendOp, LoweredDelegate)) or \
                is_edge_op(node.target) or node.target in kept:
            continue
        raise DialectError(
            f"{describe_node(node)} is neither an Edge op nor a registered backend op",
            hint="size arithmetic needs the sym_prims pass; other Python calls must be "
                 "registered with exirc.backend.ops.bind_pattern_to_op")
