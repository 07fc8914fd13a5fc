"""The partitioner most backends need: ask the backend about each node, then
group the nodes it takes into as few partitions as keep the graph acyclic.

Grouping is torch.fx's capability-based partitioner: it merges neighbouring
supported nodes and never makes a partition that a path leaves and re-enters
(which no delegate call could be placed for). Nodes the backend refuses keep
their reason, for `--explain-delegation`.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch.fx import Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from exirc.backend.delegation.interface import (
    NodeSupport,
    Partition,
    PartitionPlan,
    Rejection,
    nodes_in_order,
)
from exirc.ir.control_flow import is_control_flow

if TYPE_CHECKING:
    from torch.export import ExportedProgram


class _Decided(OperatorSupportBase):
    def __init__(self, supported: set[Node]) -> None:
        self.supported = supported

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: Node) -> bool:
        return node in self.supported


def _structural_rejection(node: Node) -> Rejection | None:
    """Nodes no delegate takes, whatever its backend."""
    if is_control_flow(node):
        return Rejection(node, "constraint",
                         "control flow stays on the interpreter (its branches may be delegated "
                         "only as a whole program of their own)")
    value = node.meta.get("val")
    results = value if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(v, torch.Tensor) for v in results):
        return Rejection(node, "op", "computes sizes, not tensors")
    return None


class CapabilityPartitioner:
    """Partitions a Backend-dialect program by one backend's NodeSupport.

    `min_nodes`: partitions with fewer compute nodes stay on the interpreter
    (a delegate call costs more than a lone cheap op gains).
    """

    def __init__(self, support: NodeSupport, min_nodes: int = 1) -> None:
        self.support = support
        self.min_nodes = min_nodes

    def partition(self, program: ExportedProgram) -> PartitionPlan:
        graph_module = program.graph_module
        plan = PartitionPlan()
        supported: set[Node] = set()
        for node in graph_module.graph.nodes:
            if node.op != "call_function":
                continue
            if node.target is operator.getitem:
                if node.args[0] in supported:
                    supported.add(node)  # goes where its producer goes
                continue
            rejection = _structural_rejection(node) or self.support.check(node, program)
            if rejection is None:
                supported.add(node)
            else:
                plan.rejections.append(rejection)
        proposed = CapabilityBasedPartitioner(
            graph_module, _Decided(supported), allows_single_node_partition=True,
        ).propose_partitions()
        position = {node: i for i, node in enumerate(graph_module.graph.nodes)}
        chosen = [nodes_in_order(p.nodes) for p in proposed]
        chosen.sort(key=lambda nodes: position[nodes[0]])
        for nodes in chosen:
            compute = [n for n in nodes if n.target is not operator.getitem]
            if not compute:
                continue
            if len(compute) < self.min_nodes:
                plan.rejections.extend(
                    Rejection(n, "partition", f"a partition of {len(compute)} node(s) is "
                              f"smaller than the minimum of {self.min_nodes}") for n in compute)
                continue
            plan.partitions.append(Partition(self.support.backend_id, nodes))
        return plan
