"""An LSTM or GRU node's input projection folded into the node's W.

`onnx_lstm.fuse_lstms` feeds each LSTM node the projected gates
(X = x @ W_ih^T + b_ih, the delegate's MatMul and Add over the whole sequence)
with W a permutation matrix that only puts the gates in ONNX's order. The node
then spends a GEMM multiplying by that permutation, and the projection costs
two or three nodes more (a MatMul, its bias Add, the Reshapes onnxruntime puts
around a Gemm). `fold_recurrent_input_projections` takes a static-shape ONNX model
without subgraphs and rewrites its graph in place: an LSTM node whose

    X = Add(MatMul(x, P), b)   or   X = MatMul(x, P)

(or either of those reversed in time, X = Slice(..., step -1 over axis 0): a
bidirectional LSTM's backward direction reads its projection so) with x of
shape [T, B, I], P a constant [I, 4H] (or [T, I, 4H] whose T slices
are equal: a weight broadcast per step), b a constant of 4H elements, W a
permutation matrix and every intermediate read by nothing else, reads x
directly, with W = the permutation's rows of P^T (exact: rows are moved, not
computed) and b, permuted the same way, added to the node's input bias.
onnxruntime then projects the sequence inside the node, in one GEMM. Results
move in the last bits (the bias is added in another order), within the zoo's
tolerances. A reversed X becomes the same Slice of x. Anything else is left
as it is.

`onnx_gru.fuse_grus` makes GRU nodes the same way (3H gates instead of 4H), and
their projections fold the same way: b goes to the input bias Wb, which a GRU
adds outside its reset gate's product, where torch adds b_ih.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy

from exirc.runtime.engines.onnx_form.graph_index import GraphIndex, Shape, static_shapes

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

_PLAIN_ATTRIBUTES = {"LSTM": frozenset({"hidden_size", "direction"}),
                     "GRU": frozenset({"hidden_size", "direction", "linear_before_reset"})}
"""The only attributes a folded node may carry: default activations, no clip,
no coupled input-forget gate, time-major layout (a GRU's reset either way: the
input projection is outside it)."""


def fold_recurrent_input_projections(model: ModelProto) -> int:
    """Fold each foldable LSTM or GRU input projection of `model` (module docstring) into
    its node, in place; how many were folded."""
    graph = model.graph
    if not any(node.op_type in _PLAIN_ATTRIBUTES for node in graph.node):
        return 0
    shapes = static_shapes(model)
    if shapes is None:
        return 0
    # Indexed once: a fold rewires only its own node, X and the Slice reversing it.
    index = GraphIndex(graph, graph.node, tag="folded")
    gone: set[int] = set()
    folded = 0
    for lstm in [node for node in graph.node if node.op_type in _PLAIN_ATTRIBUTES]:
        plan = _fold(lstm, index, shapes)
        if plan is None:
            continue
        x, weight, bias, removed, backwards = plan
        if backwards is not None:  # the Slice now reverses x itself
            backwards.input[0] = x
            backwards.output[0] = x = index.fresh(x + "_backwards")
        inputs = list(lstm.input) + [""] * (4 - len(lstm.input))
        inputs[0], inputs[1], inputs[3] = (x, index.add_constant(lstm.input[1], weight),
                                           index.add_constant(lstm.input[1] + "_bias", bias))
        del lstm.input[:]
        lstm.input.extend(inputs)
        gone |= {id(node) for node in removed}
        folded += 1
    if folded:
        index.write_back(node for node in graph.node if id(node) not in gone)
    return folded


def _fold(lstm: NodeProto, index: GraphIndex[NodeProto], shapes: dict[str, Shape]
          ) -> tuple[str, numpy.ndarray, numpy.ndarray, list[NodeProto], NodeProto | None
                     ] | None:
    """(x, the new W, the new B, the nodes no longer needed, the Slice reversing X
    if one does) for one LSTM or GRU node, or None if its projection does not fold
    exactly as the module docstring says."""
    inputs = list(lstm.input)
    if {a.name for a in lstm.attribute} - _PLAIN_ATTRIBUTES[lstm.op_type] or \
            any(inputs[4:5]) or \
            len(inputs) > 7 or index.sole_reader(inputs[0]) is None:
        return None  # sequence lengths, peepholes, options, or X read elsewhere
    permutation = _permutation(index.constant(inputs[1]))
    gate_bias = inputs[3] if len(inputs) > 3 else ""
    found_biases = index.constant(gate_bias) if gate_bias else None
    if permutation is None or (gate_bias and found_biases is None):
        return None
    gates = len(permutation)  # 4H
    biases = numpy.zeros(2 * gates, numpy.float32) if found_biases is None else \
        found_biases.astype(numpy.float32).reshape(2 * gates)
    removed: list[NodeProto] = []
    node = index.producer(inputs[0])
    backwards = node if node is not None and _reverses_time(node, index, shapes) else None
    if backwards is not None:
        if index.sole_reader(backwards.input[0]) is None:
            return None
        node = index.producer(backwards.input[0])
    bias = numpy.zeros(gates, numpy.float32)
    if node is not None and node.op_type == "Add":
        variable = [name for name in node.input if index.constant(name) is None]
        fixed = [found for name in node.input if (found := index.constant(name)) is not None]
        if len(variable) != 1 or len(fixed) != 1:
            return None
        (found,) = fixed
        if found.dtype != numpy.float32 or found.ndim > 3 or found.shape[-1:] != (gates,) or \
                found.size != gates:
            return None  # not one bias row broadcast over steps and batch
        bias = found.reshape(gates)
        removed.append(node)
        node = index.producer(variable[0])
        if index.sole_reader(variable[0]) is None:
            return None
    projection = None if node is None or node.op_type != "MatMul" else \
        index.constant(node.input[1])
    if node is None or projection is None or index.constant(node.input[0]) is not None:
        return None
    removed.append(node)
    x = node.input[0]
    x_shape = shapes.get(x)
    if x_shape is None or len(x_shape) != 3 or projection.dtype != numpy.float32 or \
            shapes.get(inputs[0]) != (*x_shape[:2], gates):
        return None  # x must be the sequence [T, B, I] itself, not broadcast over steps
    if projection.ndim == 3:  # one weight per step, as a broadcast MatMul has it
        if projection.shape[0] != x_shape[0] or \
                not all(numpy.array_equal(p, projection[0]) for p in projection[1:]):
            return None
        projection = projection[0]
    if projection.shape != (x_shape[2], gates):
        return None
    biases[:gates] += bias[permutation]
    weight = numpy.ascontiguousarray(projection.T[permutation])[None]
    return x, weight, biases[None], removed, backwards


def _reverses_time(node: NodeProto, index: GraphIndex[NodeProto],
                   shapes: dict[str, Shape]) -> bool:
    """Whether `node` is a Slice reversing a [T, ...] tensor whole along axis 0
    (start -1, step -1, an end at or before -T - 1, no other axis)."""
    if node.op_type != "Slice" or len(node.input) != 5:
        return False
    bounds = [index.constant(name) for name in node.input[1:]]
    if any(bound is None for bound in bounds):
        return False
    shape = shapes.get(node.input[0])
    start, end, axis, step = (bound.reshape(-1).tolist() for bound in bounds
                              if bound is not None)
    return shape is not None and len(start) == len(end) == len(axis) == len(step) == 1 and \
        start[0] == -1 and step[0] == -1 and axis[0] in (0, -len(shape)) and \
        end[0] <= -shape[0] - 1


def _permutation(array: numpy.ndarray | None) -> numpy.ndarray | None:
    """For a constant W of shape [1, n, n] holding exactly one 1 per row and per
    column and zeros elsewhere, the column of each row's 1; else None."""
    if array is None:
        return None
    if array.dtype != numpy.float32 or array.ndim != 3 or array.shape[0] != 1 or \
            array.shape[1] != array.shape[2]:
        return None
    matrix = array[0]
    if not numpy.all((matrix == 0) | (matrix == 1)) or \
            not numpy.all(matrix.sum(axis=0) == 1) or not numpy.all(matrix.sum(axis=1) == 1):
        return None
    return numpy.argmax(matrix, axis=1)
