"""End to end for one partition, before the delegation framework exists.

`lower_whole(model, inputs)` exports a model, runs exirc's pipeline up to
the Backend dialect, checks that XnnpackSupport takes every node, hands the
whole graph to XnnpackBackend as one partition and wraps the payload in a
minimal `.pte`: one method whose only instruction is the delegate call,
inputs and outputs planned in one arena. `run_executorch` runs that file
on ExecuTorch's own runtime (the reference for wire compatibility).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram

from exirc.backend.delegation.interface import PartitionGraph, PreprocessResult
from exirc.backend.xnnpack.serializer import XnnpackBackend, build_blob
from exirc.backend.xnnpack.support import XnnpackSupport
from exirc.edge.constants import constant_tensor
from exirc.passes.pipeline import Pipeline
from exirc.passes.runner import Instrumentation, run_pipeline
from exirc.pipelines import load_pipeline
from exirc.serialize import program as P
from exirc.serialize import serialize
from exirc.serialize.xnnpack import graph as G

ALIGNMENT = 16
DTYPES = {torch.float32: P.ScalarType.FLOAT}


def backend_program(model: torch.nn.Module, inputs: tuple[Any, ...],
                    **export: Any) -> ExportedProgram:
    """`model` exported (with `export`'s options) and taken through exirc's
    aten, edge and backend stages."""
    exported = torch.export.export(model.eval(), inputs, **export)
    full = load_pipeline("portable")
    stages = {k: v for k, v in full.stages.items() if k in ("aten", "edge", "backend")}
    pipeline = Pipeline(full.target, stages, full.source, full.registry)
    return run_pipeline(exported, pipeline, method="forward", verifiers={},
                        instrument=Instrumentation(), stage_seconds={})


def whole_partition(program: ExportedProgram) -> PartitionGraph:
    """Every node of `program` as one partition (its constants as weights)."""
    constants = {}
    for node in program.graph_module.graph.nodes:
        tensor = constant_tensor(program, node) if node.op == "placeholder" else None
        if tensor is not None:
            constants[str(node.target)] = tensor
    return PartitionGraph(program.graph_module, constants)


def rejections(program: ExportedProgram) -> list[str]:
    """`op: category: reason` for every node XnnpackSupport leaves out."""
    support = XnnpackSupport()
    found = []
    for node in program.graph_module.graph.nodes:
        if node.op == "call_function":
            rejection = support.check(node, program)
            if rejection is not None:
                found.append(f"{node.name}: {rejection.category}: {rejection.reason}")
    return found


@dataclass
class Lowered:
    partition: PartitionGraph
    result: PreprocessResult
    blob: G.XnnpackBlob
    pte: bytes


def lower_whole(model: torch.nn.Module, inputs: tuple[Any, ...]) -> Lowered:
    program = backend_program(model, inputs)
    left_out = rejections(program)
    assert not left_out, "XnnpackSupport left out: " + "; ".join(left_out)
    partition = whole_partition(program)
    blob, _ = build_blob(partition)
    result = XnnpackBackend().preprocess(partition)
    return Lowered(partition, result, blob, delegate_pte(partition, result))


def _tensor(node: torch.fx.Node, offset: int) -> tuple[P.Tensor, int]:
    val = node.meta["val"]
    sizes = [int(d) for d in val.shape]
    tensor = P.Tensor(DTYPES[val.dtype], sizes, list(range(len(sizes))),
                      allocation_info=P.AllocationDetails.at(1, offset))
    end = offset + tensor.nbytes
    return tensor, end + (-end % ALIGNMENT)


def delegate_pte(partition: PartitionGraph, result: PreprocessResult) -> bytes:
    """A `.pte` whose forward is one DelegateCall of the payload."""
    values: list[P.EValue] = []
    offset = 0
    for node in [*partition.runtime_inputs, *partition.outputs]:
        tensor, offset = _tensor(node, offset)
        values.append(tensor)
    n_in = len(partition.runtime_inputs)
    inputs, outputs = list(range(n_in)), list(range(n_in, len(values)))
    chain = P.Chain(inputs, outputs, [P.DelegateCall(0, inputs + outputs)])
    delegate = P.BackendDelegate(
        "XnnpackBackend", P.BackendDelegateDataReference(P.DataLocation.SEGMENT, 0),
        [P.CompileSpec(key, value) for key, value in result.compile_specs])
    plan = P.ExecutionPlan(name="forward", values=values, inputs=inputs, outputs=outputs,
                           chains=[chain], delegates=[delegate],
                           non_const_buffer_sizes=[0, max(offset, ALIGNMENT)])
    program = P.Program(execution_plan=[plan], segments=[P.DataSegment(result.processed)])
    # The reserved constant entry: ExecuTorch reads a file with segments but
    # no constant offsets as the inline constant_buffer layout it dropped.
    empty, offsets = P.pack_subsegments([b""], P.CONSTANT_ALIGNMENT)
    program.constant_segment = P.SubsegmentOffsets(len(program.segments), offsets)
    program.segments.append(P.DataSegment(empty))
    for key, data in result.named_data.items():
        program.add_named_segment(key, data)
    return serialize(program)


def run_executorch(pte: bytes, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    from tests.oracle import executorch_method

    return list(executorch_method(pte)(inputs))


def eager(model: torch.nn.Module, inputs: tuple[Any, ...]) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model.eval()(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def transposes(blob: G.XnnpackBlob) -> int:
    return sum(n.kind == G.NodeKind.STATIC_TRANSPOSE for n in blob.graph.nodes)
