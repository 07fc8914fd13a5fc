"""What partitioners and delegation backends implement, and what they exchange."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch.fx import GraphModule, Node


@dataclass(frozen=True)
class Rejection:
    """A node a partitioner left out, and why (shown by --explain-delegation).

    `category` is one of "op", "dtype", "shape", "constraint" (a limit of
    the backend, e.g. an unsupported stride) or "partition" (supported, but
    left alone, e.g. a partition too small to be worth a call).
    """

    node: Node
    category: str
    reason: str


@dataclass
class Partition:
    """Nodes of one program graph (call_function nodes, in graph order) that a
    backend takes as one delegate."""

    backend_id: str
    nodes: list[Node]


@dataclass
class PartitionPlan:
    partitions: list[Partition] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)


class Partitioner(Protocol):
    """Chooses the partitions of a Backend-dialect program.

    Users plug their own by `module:attr` (a class or an instance), as
    passes are plugged. The graph must not be changed.
    """

    def partition(self, program: torch.export.ExportedProgram) -> PartitionPlan: ...


class NodeSupport(Protocol):
    """Per-node answer of a backend: None when it takes the node, else a Rejection."""

    backend_id: str

    def check(self, node: Node, program: torch.export.ExportedProgram) -> Rejection | None: ...


@dataclass
class PartitionGraph:
    """One partition, cut out of its program: what `preprocess` receives.

    `graph_module`'s placeholders are the partition's inputs in order: the
    ones named in `constants` are weights (their tensor given there), the
    others are the delegate call's tensor arguments, in the order of
    `runtime_inputs`. Its output node returns the partition's results as a
    tuple. Nodes keep their metadata (`val`, `stack_trace`, ...).
    """

    graph_module: GraphModule
    constants: dict[str, torch.Tensor]

    @property
    def placeholders(self) -> list[Node]:
        return [n for n in self.graph_module.graph.nodes if n.op == "placeholder"]

    @property
    def runtime_inputs(self) -> list[Node]:
        return [n for n in self.placeholders if n.target not in self.constants]

    @property
    def outputs(self) -> list[Node]:
        results = self.graph_module.graph.output_node().args[0]
        assert isinstance(results, (list, tuple))
        return list(results)


@dataclass(frozen=True)
class DelegateSummary:
    """What a payload holds, for reports: its node count, op kinds and weights."""

    node_count: int
    op_kinds: dict[str, int]
    weight_bytes: int


@dataclass
class PreprocessResult:
    """A partition as its backend stores it.

    `named_data` holds weights by key (stored once in the program, shared by
    every delegate that uses the same key); `processed` refers to them.
    """

    processed: bytes
    compile_specs: list[tuple[str, bytes]] = field(default_factory=list)
    named_data: dict[str, bytes] = field(default_factory=dict)
    summary: DelegateSummary | None = None


class DelegationBackend(Protocol):
    """Turns partitions into payloads; `backend_id` is the id the runtime finds it by."""

    backend_id: str

    def preprocess(self, partition: PartitionGraph) -> PreprocessResult: ...


def nodes_in_order(nodes: Iterable[Node]) -> list[Node]:
    """`nodes` in their graph's order."""
    chosen = set(nodes)
    if not chosen:
        return []
    graph = next(iter(chosen)).graph
    return [n for n in graph.nodes if n in chosen]
