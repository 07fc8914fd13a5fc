"""The Edge dialect verifier, run after the edge stage.

Rules: every call is an Edge op (see `ops.py`); no node outputs a Python
scalar except size queries (the Edge spec keeps scalars off the graph's
edges so every value has a dtype); and every op's dtypes satisfy its
constraints in `dtype_constraints.yaml`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from exirc.control_flow import all_nodes, is_control_flow
from exirc.edge.ops import SIZE_OPS, is_edge_op
from exirc.errors import DialectError
from exirc.source import describe_node

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def verify_edge(program: ExportedProgram) -> None:
    graph_module = program.graph_module
    for node in all_nodes(graph_module):
        if node.op != "call_function" or is_control_flow(node):
            continue
        # Python arithmetic on SymInts (sizes under dynamic shapes) stays until the
        # backend's sym_prims pass; the Backend verifier rejects what is left of it.
        size_arithmetic = not isinstance(node.target, torch._ops.OpOverload) and \
            isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))
        if not is_edge_op(node.target) and not size_arithmetic:
            raise DialectError(
                f"{describe_node(node)} is not an Edge op",
                hint="the Edge dialect admits core ATen ops; add a decomposition for it, "
                     "or run the to_edge and views_to_copies passes before")
        value = node.meta.get("val")
        if isinstance(value, (int, float, bool)) and not isinstance(value, torch.SymInt) and \
                isinstance(node.target, torch._ops.OpOverload) and \
                node.target._schema.name not in SIZE_OPS:
            raise DialectError(f"{describe_node(node)} outputs a Python scalar",
                               hint="Edge ops produce tensors; keep the value a 0-d tensor")
    from exirc.edge.dtypes import verify_dtypes

    verify_dtypes(graph_module)
