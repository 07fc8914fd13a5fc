"""What delegation decided, for people (`compile --explain-delegation`) and
programs (its JSON form): every partition, and every node left out with why."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.fx import Node

from exirc.backend.delegation.interface import DelegateSummary, Rejection
from exirc.ir.source import source_location


def op_name(node: Node) -> str:
    target: Any = node.target
    if isinstance(target, torch._ops.OpOverload):
        overload = target._overloadname
        base = target._schema.name.removeprefix("aten::")
        return base if overload == "default" else f"{base}.{overload}"
    return str(getattr(target, "__name__", target))


@dataclass
class PartitionEntry:
    delegate: str                 # the call target's name, e.g. XnnpackBackend_0
    backend_id: str
    ops: dict[str, int]           # op name -> count in the graph partition
    sources: list[str]            # distinct source lines, in graph order
    payload_bytes: int
    weight_bytes: int
    backend_nodes: int | None = None       # what the backend made of it
    backend_ops: dict[str, int] = field(default_factory=dict)
    # The weights by content -> bytes: methods (prefill, decode) delegating the
    # same layers share them, stored once (for summaries; not in the JSON)
    weight_digests: dict[str, int] = field(default_factory=dict)


@dataclass
class LeftOut:
    node: str
    op: str
    category: str
    reason: str
    source: str | None


@dataclass
class DelegationReport:
    """One method's delegation: partitions, and the nodes left on the interpreter."""

    partitioner: str
    partitions: list[PartitionEntry] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)
    compute_nodes: int = 0        # call nodes before delegation (getitem excluded)

    @property
    def delegated_nodes(self) -> int:
        return sum(sum(p.ops.values()) for p in self.partitions)

    def add_partition(self, delegate: str, backend_id: str, nodes: list[Node],
                      payload_bytes: int, weight_bytes: int,
                      summary: DelegateSummary | None,
                      weight_digests: dict[str, int] | None = None) -> None:
        ops = Counter(op_name(n) for n in nodes if op_name(n) != "getitem")
        sources = list(dict.fromkeys(s for s in map(source_location, nodes) if s))
        self.partitions.append(PartitionEntry(
            delegate, backend_id, dict(ops), sources, payload_bytes, weight_bytes,
            summary.node_count if summary else None,
            dict(summary.op_kinds) if summary else {}, dict(weight_digests or {})))

    def add_rejection(self, rejection: Rejection) -> None:
        node = rejection.node
        self.left_out.append(LeftOut(node.name, op_name(node), rejection.category,
                                     rejection.reason, source_location(node)))

    def to_json(self) -> dict[str, Any]:
        return {"partitioner": self.partitioner, "compute_nodes": self.compute_nodes,
                "delegated_nodes": self.delegated_nodes,
                "partitions": [_partition_json(p) for p in self.partitions],
                "left_out": [asdict(x) for x in self.left_out]}


def _partition_json(partition: PartitionEntry) -> dict[str, Any]:
    entry = asdict(partition)
    del entry["weight_digests"]
    return entry


def unique_weight_bytes(reports: Any) -> int:
    """The delegated weights' bytes over methods (`reports`: DelegationReports),
    each weight once however many methods' partitions read it."""
    unique: dict[str, int] = {}
    unkeyed = 0
    for report in reports:
        for partition in report.partitions:
            if partition.weight_digests:
                unique.update(partition.weight_digests)
            else:
                unkeyed += partition.weight_bytes
    return sum(unique.values()) + unkeyed
