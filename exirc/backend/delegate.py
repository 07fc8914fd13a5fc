"""The delegate pass: partitions of the graph handed to backends."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from exirc.backend.delegation.cut import extract, replace
from exirc.backend.delegation.interface import PreprocessResult
from exirc.backend.delegation.lowered import LoweredDelegate
from exirc.backend.delegation.registry import delegation_backend, resolve_partitioner
from exirc.backend.delegation.report import DelegationReport
from exirc.backend.delegation.shared_views import remake_shared_views
from exirc.errors import InternalError, UsageError
from exirc.ir.content import content_digest
from exirc.ir.meta import set_delegation_report
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram


@dataclass(frozen=True)
class Delegate(Pass):
    """Backend -> Backend with delegate calls: each partition the partitioner
    chooses becomes one call of a `LoweredDelegate` holding its backend's
    payload; the rest stays as it was, for the target's kernels.

    `partitioner` is a built-in name (`xnnpack`) or `module:attr`. Weights
    only delegates read are dropped from the program by the
    dead_code_elimination that follows: the payload (or its named data)
    holds them, so they are stored once.
    """

    name: ClassVar[str] = "delegate"
    partitioner: str = "xnnpack"

    def run(self, program: ExportedProgram) -> PassResult:
        partitioner = resolve_partitioner(self.partitioner)
        graph_module = program.graph_module
        plan = partitioner.partition(program)
        remake_shared_views(plan.partitions)  # before counting: its copies are nodes too
        report = DelegationReport(self.partitioner, compute_nodes=sum(
            1 for n in graph_module.graph.nodes
            if n.op == "call_function" and n.target is not operator.getitem))
        for rejection in plan.rejections:
            report.add_rejection(rejection)
        for index, partition in enumerate(plan.partitions):
            nodes = partition.nodes
            if any(n.graph is not graph_module.graph for n in nodes):
                raise UsageError(f"partitioner {self.partitioner} returned nodes of another "
                                 "graph", hint="partition only the program's top-level graph")
            piece = extract(program, nodes)
            result = delegation_backend(partition.backend_id).preprocess(piece)
            if not isinstance(result.processed, (bytes, bytearray)):
                raise InternalError(f"backend {partition.backend_id} returned a "
                                    f"{type(result.processed).__name__} payload, not bytes")
            lowered = LoweredDelegate(f"{partition.backend_id}_{index}", partition.backend_id,
                                      piece, result)
            weight_bytes = _stored_weight_bytes(piece.constants.values(), result)
            digests = {content_digest(t): t.nbytes for t in piece.constants.values()}
            report.add_partition(lowered.name, partition.backend_id, nodes,
                                 len(result.processed), weight_bytes, result.summary, digests)
            replace(program, nodes, lowered)
        set_delegation_report(graph_module, report)
        return PassResult(program, bool(plan.partitions))


def _stored_weight_bytes(constants: Iterable[torch.Tensor], result: PreprocessResult) -> int:
    """The weight bytes a partition's payload stores: its backend's figure, else
    its distinct constants (a weight folded once per time step of an unrolled
    recurrence is one weight, stored once)."""
    if result.summary is not None:
        return result.summary.weight_bytes
    return sum({content_digest(t): t.nbytes for t in constants}.values())
