"""An XNNPACK graph, already checked and compiled for torch, rewritten as an ONNX model.

onnxruntime runs convolutional and small-op graphs several times faster than
torch calls one node at a time (its kernels fuse, pack weights once and keep
NCHWc layouts between convolutions). `to_onnx` takes the graph *after*
`compile.compile_graph` accepted it: every id, parameter, shape and constant
has been checked there, so nothing here reads file bytes; the weights come
from the compiled graph's value table (the tensors the torch path uses).

Only float32 graphs of the node kinds in `onnx_nodes.EMITTERS` are taken, with
static shapes (the blob's declared input dims; a call with other dims runs on
torch, see `onnx_engine`). Anything else raises `NotMapped` naming the first
node or value it cannot take, and the whole delegate stays on the torch path.

Layout: values keep XNNPACK's layouts (NHWC activations). Nodes that ONNX
defines on NCHW (convolution, pooling) are wrapped in a pair of Transposes;
onnxruntime's transpose optimizer cancels the pairs between neighbours.
Clamps are fused into their producers first (`fuse.fuse_clamps`), exactly as
the torch path does, and emitted as Relu or Clip after the producer. Runs of
nodes that are one ONNX operator are emitted as that operator: a decomposed
layer norm (`onnx_fusions`), sibling slices as a Split (`onnx_split`). The
finished model is rewritten by `rules.DELEGATE_RULES`, in order (fewer
Reshapes, GELU, hard sigmoid, LSTM and GRU layers as single nodes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from exirc.runtime.delegates.xnnpack.compile import CompiledGraph, External
from exirc.runtime.delegates.xnnpack.fuse import fuse_clamps
from exirc.runtime.engines.onnx_form.builder import NotMapped, OnnxBuilder, value_name
from exirc.runtime.engines.onnx_form.rewrites.fusions import plan_fusions
from exirc.runtime.engines.onnx_form.rewrites.split import plan_splits
from exirc.runtime.engines.onnx_form.rules import DELEGATE_RULES, RuleLog, apply_rules
from exirc.runtime.engines.onnx_form.xnnpack_nodes import EMITTERS
from exirc.serialize.xnnpack import graph as G

if TYPE_CHECKING:
    from onnx import ModelProto

OPSET = 20  # Gelu (20), ReduceMean with axes as an input (18)
IR_VERSION = 10  # what onnxruntime >= 1.20 reads


@dataclass(frozen=True)
class OnnxModel:
    """A delegate as an ONNX model: the model, and which argument each graph
    input and output is (names in the order of the compiled graph's externals)."""

    model: ModelProto
    inputs: list[External]
    outputs: list[External]
    input_names: list[str]
    output_names: list[str]
    rules: RuleLog = dataclasses.field(default_factory=RuleLog)  # what the rewrites did


def _value_ids(params: G.NodeParams) -> list[int]:
    return [getattr(params, f.name) for f in dataclasses.fields(params)
            if f.name.endswith("_id") and getattr(params, f.name) != G.INVALID_VALUE_ID]


def _require_fp32(builder: OnnxBuilder, node: G.Node, label: str) -> None:
    for value_id in _value_ids(node.params):
        if not builder.plain_float32(value_id):
            raise NotMapped(f"{label}: value {value_id} is not float32")


def to_onnx(graph: G.XNNGraph, compiled: CompiledGraph) -> OnnxModel:
    """The ONNX model computing what `compiled` computes; `NotMapped` if there is none
    we are sure of. `graph` is the one `compiled` was made from (and checked by)."""
    slots = {v.id_out: i for i, v in enumerate(graph.values)}
    constants = {value_id: compiled.template[slot] for value_id, slot in slots.items()
                 if compiled.template[slot] is not None}
    for value_id, tensor in constants.items():
        if tensor.dtype != torch.float32:
            raise NotMapped(f"constant {value_id} is {tensor.dtype}, not float32")
    for external in (*compiled.inputs, *compiled.outputs):
        if external.dtype != torch.float32:
            raise NotMapped(f"delegate argument {external.arg} is {external.dtype}")
    builder = OnnxBuilder(graph, constants, compiled.shapes)
    nodes = fuse_clamps(graph)
    fusions = plan_fusions(builder, nodes, graph.output_ids)
    splits = plan_splits(builder, nodes, fusions.covered)
    for position, (index, node) in enumerate(nodes):
        if fusions.emit(builder, position) or splits.emit(builder, position):
            continue  # part of a run emitted as one operator (layer norm, split)
        label = f"node {index} ({node.kind.name.lower()})"
        emit = EMITTERS.get(node.kind)
        if emit is None:
            raise NotMapped(f"{label}: no ONNX form")
        _require_fp32(builder, node, label)
        try:
            emit(builder, node)
        except NotMapped as reason:
            raise NotMapped(f"{label}: {reason}") from None
    model = _model(builder, compiled)
    model.rules.fired.update(apply_rules(model.model, DELEGATE_RULES).fired)
    return model


def _model(builder: OnnxBuilder, compiled: CompiledGraph) -> OnnxModel:
    helper = builder.helper
    from onnx import TensorProto

    def declare(external: External) -> Any:
        return helper.make_tensor_value_info(value_name(external.value_id), TensorProto.FLOAT,
                                             list(external.dims))

    graph = helper.make_graph(builder.nodes, "xnnpack_delegate",
                              [declare(e) for e in compiled.inputs],
                              [declare(e) for e in compiled.outputs],
                              builder.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="exirc")
    model.ir_version = IR_VERSION
    return OnnxModel(model, list(compiled.inputs), list(compiled.outputs),
                     [value_name(e.value_id) for e in compiled.inputs],
                     [value_name(e.value_id) for e in compiled.outputs])
