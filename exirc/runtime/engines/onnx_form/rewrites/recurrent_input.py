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

from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy

from exirc.runtime.engines.onnx_form.rewrites.reshapes import inferred_shapes

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
    import onnx

    graph = model.graph
    if not any(node.op_type in _PLAIN_ATTRIBUTES for node in graph.node):
        return 0
    try:
        shapes = inferred_shapes(model)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return 0
    constants = {t.name: t for t in graph.initializer}
    producer = {name: node for node in graph.node for name in node.output}
    readers = Counter(name for node in graph.node for name in node.input)
    readers.update(output.name for output in graph.output)
    gone: set[int] = set()
    folded = 0
    for lstm in [node for node in graph.node if node.op_type in _PLAIN_ATTRIBUTES]:
        plan = _fold(lstm, producer, readers, constants, shapes)
        if plan is None:
            continue
        x, weight, bias, removed, backwards = plan
        if backwards is not None:  # the Slice now reverses x itself
            backwards.input[0] = x
            backwards.output[0] = x = _fresh(graph, x + "_backwards")
        w_name = _fresh(graph, lstm.input[1] + "_folded")
        graph.initializer.append(onnx.numpy_helper.from_array(weight, w_name))
        b_name = _fresh(graph, lstm.input[1] + "_bias_folded")
        graph.initializer.append(onnx.numpy_helper.from_array(bias, b_name))
        inputs = list(lstm.input) + [""] * (4 - len(lstm.input))
        inputs[0], inputs[1], inputs[3] = x, w_name, b_name
        del lstm.input[:]
        lstm.input.extend(inputs)
        gone |= {id(node) for node in removed}
        folded += 1
    if folded:
        kept = [node for node in graph.node if id(node) not in gone]
        del graph.node[:]
        graph.node.extend(kept)
        read = {name for node in kept for name in node.input}
        for tensor in [t for t in graph.initializer if t.name not in read]:
            graph.initializer.remove(tensor)
    return folded


def _fold(lstm: NodeProto, producer: dict[str, NodeProto], readers: Counter[str],
          constants: dict[str, Any], shapes: dict[str, tuple[int, ...]]
          ) -> tuple[str, numpy.ndarray, numpy.ndarray, list[NodeProto], NodeProto | None
                     ] | None:
    """(x, the new W, the new B, the nodes no longer needed, the Slice reversing X
    if one does) for one LSTM or GRU node, or None if its projection does not fold
    exactly as the module docstring says."""
    from onnx import numpy_helper

    inputs = list(lstm.input)
    if {a.name for a in lstm.attribute} - _PLAIN_ATTRIBUTES[lstm.op_type] or \
            any(inputs[4:5]) or \
            len(inputs) > 7 or readers[inputs[0]] != 1:
        return None  # sequence lengths, peepholes, options, or X read elsewhere
    permutation = _permutation(constants.get(inputs[1]))
    gate_bias = inputs[3] if len(inputs) > 3 else ""
    if permutation is None or (gate_bias and gate_bias not in constants):
        return None
    gates = len(permutation)  # 4H
    biases = numpy.zeros(2 * gates, numpy.float32) if not gate_bias else \
        numpy_helper.to_array(constants[gate_bias]).astype(numpy.float32).reshape(2 * gates)
    removed: list[NodeProto] = []
    node = producer.get(inputs[0])
    backwards = node if node is not None and _reverses_time(node, constants, shapes) else None
    if backwards is not None:
        if readers[backwards.input[0]] != 1:
            return None
        node = producer.get(backwards.input[0])
    bias = numpy.zeros(gates, numpy.float32)
    if node is not None and node.op_type == "Add":
        variable = [name for name in node.input if name not in constants]
        fixed = [name for name in node.input if name in constants]
        if len(variable) != 1 or len(fixed) != 1:
            return None
        found = numpy_helper.to_array(constants[fixed[0]])
        if found.dtype != numpy.float32 or found.ndim > 3 or found.shape[-1:] != (gates,) or \
                found.size != gates:
            return None  # not one bias row broadcast over steps and batch
        bias = found.reshape(gates)
        removed.append(node)
        node = producer.get(variable[0])
        if readers[variable[0]] != 1:
            return None
    if node is None or node.op_type != "MatMul" or node.input[1] not in constants or \
            node.input[0] in constants:
        return None
    removed.append(node)
    x = node.input[0]
    projection = numpy_helper.to_array(constants[node.input[1]])
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


def _reverses_time(node: NodeProto, constants: dict[str, Any],
                   shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether `node` is a Slice reversing a [T, ...] tensor whole along axis 0
    (start -1, step -1, an end at or before -T - 1, no other axis)."""
    from onnx import numpy_helper

    if node.op_type != "Slice" or len(node.input) != 5 or \
            not all(name in constants for name in node.input[1:]):
        return False
    shape = shapes.get(node.input[0])
    start, end, axis, step = (numpy_helper.to_array(constants[name]).reshape(-1).tolist()
                              for name in node.input[1:])
    return shape is not None and len(start) == len(end) == len(axis) == len(step) == 1 and \
        start[0] == -1 and step[0] == -1 and axis[0] in (0, -len(shape)) and \
        end[0] <= -shape[0] - 1


def _permutation(tensor: Any) -> numpy.ndarray | None:
    """For a constant W of shape [1, n, n] holding exactly one 1 per row and per
    column and zeros elsewhere, the column of each row's 1; else None."""
    if tensor is None:
        return None
    from onnx import numpy_helper

    array = numpy_helper.to_array(tensor)
    if array.dtype != numpy.float32 or array.ndim != 3 or array.shape[0] != 1 or \
            array.shape[1] != array.shape[2]:
        return None
    matrix = array[0]
    if not numpy.all((matrix == 0) | (matrix == 1)) or \
            not numpy.all(matrix.sum(axis=0) == 1) or not numpy.all(matrix.sum(axis=1) == 1):
        return None
    return numpy.argmax(matrix, axis=1)


def _fresh(graph: Any, stem: str) -> str:
    taken = {t.name for t in graph.initializer} | \
        {name for node in graph.node for name in (*node.input, *node.output)}
    name, count = stem, 0
    while name in taken:
        count += 1
        name = f"{stem}_{count}"
    return name
