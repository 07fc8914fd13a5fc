"""A decomposed hard sigmoid in a finished ONNX model as one `HardSigmoid` node.

torch's hardsigmoid, relu6(x + 3) / 6 (MobileNetV3's squeeze-excite gate),
reaches the XNNPACK delegate as an Add, a Clip and a Div, three kernels to
onnxruntime, which also cannot fuse them into the convolution before them.
`fuse_hardsigmoids` takes the model `onnx_graph._model` makes (static shapes,
no subgraphs) and rewrites its graph in place: each

    y = Div(Clip(Add(x, 3), 0, 6), 6)

becomes y = HardSigmoid(x, alpha=1/6, beta=1/2), which onnxruntime folds into
a preceding Conv. Matched strictly: every constant a one-element float32
initializer exactly equal to its value, the Add's and the Clip's outputs read
only by the next node and not graph outputs, y of x's shape (no broadcast).
HardSigmoid computes clip(x / 6 + 1/2, 0, 1): results move in the last bits,
within the zoo's tolerances.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exirc.runtime.engines.onnx_form.graph_index import GraphIndex, static_shapes

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto


def fuse_hardsigmoids(model: ModelProto) -> int:
    """Rewrite each hard sigmoid of `model` (module docstring) as one node, in place;
    how many were rewritten."""
    import onnx

    graph = model.graph
    if not {"Add", "Clip", "Div"} <= {node.op_type for node in graph.node}:
        return 0  # nothing to find: skip shape inference
    index = GraphIndex(graph, graph.node)
    matches = [match for node in graph.node if node.op_type == "Add"
               if (match := _match(node, index)) is not None]
    if not matches:
        return 0
    shapes = static_shapes(model)
    if shapes is None:
        return 0
    replaced: dict[int, NodeProto] = {}
    gone: set[int] = set()
    for x, nodes in matches:
        shape = shapes.get(x)
        if shape is None or shapes.get(nodes[-1].output[0]) != shape:
            continue  # a broadcast to more dims, or shapes unknown
        replaced[id(nodes[0])] = onnx.helper.make_node(
            "HardSigmoid", [x], [nodes[-1].output[0]], alpha=1.0 / 6.0, beta=0.5)
        gone |= {id(node) for node in nodes[1:]}
    if not replaced:
        return 0
    index.write_back(replaced.get(id(node), node) for node in graph.node if id(node) not in gone)
    return len(replaced)


def _match(add: NodeProto, index: GraphIndex[NodeProto]) -> tuple[str, list[NodeProto]] | None:
    """(x, [Add, Clip, Div]) if `add` starts a hard sigmoid, else None."""
    variable = [name for name in add.input if index.initializer(name) is None]
    if len(variable) != 1 or index.scalar(_other(add, variable[0])) != 3.0:
        return None
    clip = index.sole_reader(add.output[0])
    if clip is None or clip.op_type != "Clip" or len(clip.input) != 3 or \
            clip.input[0] != add.output[0] or index.scalar(clip.input[1]) != 0.0 or \
            index.scalar(clip.input[2]) != 6.0:
        return None
    div = index.sole_reader(clip.output[0])
    if div is None or div.op_type != "Div" or list(div.input[:1]) != [clip.output[0]] or \
            index.scalar(div.input[1]) != 6.0:
        return None
    return variable[0], [add, clip, div]


def _other(node: NodeProto, name: str) -> str:
    return node.input[1] if node.input[0] == name else node.input[0]
