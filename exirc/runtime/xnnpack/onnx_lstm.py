"""An unrolled LSTM layer in a finished ONNX model as one ONNX `LSTM` node.

torch decomposes `nn.LSTM` into one cell per layer and time step, and the
XNNPACK delegate's ONNX form has ~12 nodes per cell (onnxruntime: ~0.5 us a
node). `fuse_lstms` takes the model `onnx_graph._model` makes (static shapes,
no subgraphs) and rewrites its graph in place: each run of cells

    gates = x_t [+ h_prev @ Wr] [+ constants]   (a tree of Adds)
    i, f, g, o = Split(gates, 4 equal parts, last axis)   (any order)
    c = sigmoid(f) * c_prev + sigmoid(i) * tanh(g);  h = sigmoid(o) * tanh(c)

where step t + 1 reads step t's h (through the MatMul) and c, with the same
Wr and constants, becomes one LSTM node: X = the steps' x_t ([T, B, 4H]), W a
permutation matrix putting the gates in ONNX's order (i, o, f, c; exact: one
1 a row; `onnx_lstm_input` later folds the projection of x_t into it), R and B
from Wr and the constants in that order. A first step whose
h_prev term was folded into a constant (h0 = 0) fits when that constant is
the bias of the next step; c0 is whatever the first step reads. Each value
read elsewhere keeps its name, shape and meaning: the last h and c are the
node's Y_h and Y_c, a Concat (or chain of Concats) of all the h's in order
is a Reshape of Y, in reverse order a Reshape of Y reversed, any other step's
h is a Gather from Y; a step whose c is read elsewhere ends the
run (the next one starts another node from that c).

The pattern is matched strictly: an intermediate value read by anything else,
other activations, another split, constants that differ between steps or per
batch row, or shapes inference cannot tell exactly leave those cells as they
are. onnxruntime's LSTM sums in another order: results move in the last bits.
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING, Any

import numpy

from exirc.runtime.xnnpack.onnx_lstm_match import LstmMatcher, Segment, Shape
from exirc.runtime.xnnpack.onnx_reshapes import inferred_shapes

if TYPE_CHECKING:
    from onnx import ModelProto


def fuse_lstms(model: ModelProto) -> bool:
    """Rewrite `model`'s graph in place with unrolled LSTM layers as LSTM nodes
    (module docstring); True if anything changed. Takes and returns a static-shape
    ONNX model without subgraphs; one whose shapes cannot be inferred is left alone."""
    import onnx

    graph = model.graph
    if any(attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for node in graph.node for attribute in node.attribute):
        return False
    if not {"Split", "Sigmoid", "Tanh"} <= {node.op_type for node in graph.node}:
        return False  # no cell to find: skip shape inference (~2 ms on lstm_tagger)
    try:
        shapes = inferred_shapes(model)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return False
    fuser = _Rewriter(model, shapes)
    segments = fuser.segments()
    if not segments:
        return False
    return fuser.rewrite(segments)


class _Rewriter(LstmMatcher):
    """The matcher, and the new nodes and initializers that replace the segments."""

    def __init__(self, model: ModelProto, shapes: dict[str, Shape]) -> None:
        super().__init__(model, shapes)
        self.names = set(self.producer) | set(self.read_by) | set(self.initializers)
        self.new_nodes: list[Any] = []
        self.new_initializers: list[Any] = []
        self._counter = 0

    def fresh(self, stem: str) -> str:
        while True:
            self._counter += 1
            name = f"{stem}_lstm{self._counter}"
            if name not in self.names:
                self.names.add(name)
                return name

    def add_constant(self, stem: str, array: numpy.ndarray) -> str:
        name = self.fresh(stem)
        self.new_initializers.append(self.onnx.numpy_helper.from_array(array, name))
        return name

    def add(self, op_type: str, inputs: list[str], outputs: list[str], **attributes: Any) -> str:
        self.new_nodes.append(self.onnx.helper.make_node(op_type, inputs, outputs, **attributes))
        return outputs[0]

    def reshaped(self, name: str, shape: Shape, target: str | None = None) -> str:
        """`name` as `shape` (a Reshape, or a reshaped constant; itself if it is one)."""
        if self.shapes.get(name) == shape and target is None:
            return name
        array = self.constant(name)
        if array is not None and target is None:
            return self.add_constant("state", array.reshape(shape))
        shape_name = self.add_constant("shape", numpy.asarray(shape, dtype=numpy.int64))
        return self.add("Reshape", [name, shape_name], [target or self.fresh("reshape")])

    def rewrite(self, segments: list[Segment]) -> bool:
        """Replace each segment's nodes by an LSTM node and write the graph back."""
        removed = {id(node) for segment in segments for c in segment.cells for node in c.body}
        for segment in segments:
            self._emit(segment)
        for segment in segments:
            removed |= self._concats_as_reshapes(segment)
        kept = [node for node in self.nodes if id(node) not in removed]
        read = {name for node in (*kept, *self.new_nodes) for name in node.input} | self.outputs
        for segment in segments:
            self._states_read_elsewhere(segment, read)
        nodes = _live(_topological(kept + self.new_nodes, self.graph, self.new_initializers),
                      self.outputs)
        if nodes is None:
            return False
        self.graph.node.clear()
        self.graph.node.extend(nodes)
        self.graph.initializer.extend(self.new_initializers)
        read = {name for node in nodes for name in node.input}
        kept_initializers = [t for t in self.graph.initializer if t.name in read]
        del self.graph.initializer[:]
        self.graph.initializer.extend(kept_initializers)
        del self.graph.value_info[:]
        return True

    def _emit(self, segment: Segment) -> None:
        first = segment.cells[0]
        width, batch, steps = first.width, first.batch, len(segment.cells)
        order = numpy.concatenate([numpy.arange(k * width, (k + 1) * width)
                                   for k in first.order])
        state = (1, batch, width)
        inputs = [self._sequence(segment),
                  self.add_constant("W", numpy.eye(4 * width, dtype=numpy.float32)[order][None]),
                  self.add_constant("R", numpy.ascontiguousarray(segment.weight.T[order])[None]),
                  self.add_constant("B", numpy.concatenate(
                      [numpy.zeros(4 * width, numpy.float32), segment.bias[order]])[None]),
                  "",
                  "" if segment.initial_h is None else self.reshaped(segment.initial_h, state),
                  self._initial_c(first.c_prev, state)]
        segment.outputs = [self.fresh("Y"), self.fresh("Y_h"), self.fresh("Y_c")]
        self.add("LSTM", inputs, segment.outputs, hidden_size=width)
        self.shapes[segment.outputs[0]] = (steps, 1, batch, width)
        self.shapes[segment.outputs[1]] = self.shapes[segment.outputs[2]] = state

    def _initial_c(self, name: str, state: Shape) -> str:
        array = self.constant(name)
        if array is not None and not array.any():
            return ""
        return self.reshaped(name, state)

    def _sequence(self, segment: Segment) -> str:
        """X: the steps' x_t as [T, B, 4H]; the tensor they were split from if they are
        its parts in order, else a Concat."""
        first = segment.cells[0]
        shape = (len(segment.cells), first.batch, 4 * first.width)
        sources = []
        for cell in segment.cells:
            node = self.producer.get(cell.x)
            sources.append(node.input[0] if node is not None and node.op_type == "Reshape"
                           else cell.x)
        split = self.producer.get(sources[0])
        if split is not None and split.op_type == "Split" and list(split.output) == sources and \
                next((a.i for a in split.attribute if a.name == "axis"), 0) == 0 and \
                self.shapes.get(split.input[0], (0,))[0] == len(sources) and \
                prod(self.shapes[split.input[0]]) == prod(shape):
            return self.reshaped(split.input[0], shape)
        parts = [self.reshaped(cell.x, (1, *shape[1:])) for cell in segment.cells]
        return self.add("Concat", parts, [self.fresh("X")], axis=0) if len(parts) > 1 else parts[0]

    def _concats_as_reshapes(self, segment: Segment) -> set[int]:
        """Concats of all the segment's h, in order or in reverse (a bidirectional
        LSTM's backward direction), along an axis with only 1s before it, made
        Reshapes of Y (of Y backwards, a Slice with step -1); their ids. A Concat
        may be a chain of Concats (XNNPACK joins at most a few at a time): the
        inner ones, read by nothing else, are left for `_live` to drop."""
        hs = [cell.h for cell in segment.cells]
        done = set()
        for node in self.nodes:
            if node.op_type != "Concat" or node.output[0] not in self.shapes:
                continue
            axis = _axis(node)
            parts = self._concatenated(node, axis)
            shape = segment.cells[0].shape
            if prod(shape[:axis % len(shape)]) != 1 or parts not in (hs, hs[::-1]):
                continue
            y = segment.outputs[0] if parts == hs else self._backwards(segment.outputs[0])
            self.reshaped(y, self.shapes[node.output[0]], node.output[0])
            done.add(id(node))
        return done

    def _backwards(self, y: str) -> str:
        """`y` reversed along axis 0: a Slice from its last element back past the first."""
        bounds = {"start": -1, "end": numpy.iinfo(numpy.int64).min, "axis": 0, "step": -1}
        reversed_y = self.add("Slice", [y, *(self.add_constant(stem, numpy.asarray([value],
                                                                                  numpy.int64))
                                             for stem, value in bounds.items())],
                              [self.fresh("Y_backwards")])
        self.shapes[reversed_y] = self.shapes[y]
        return reversed_y

    def _concatenated(self, node: Any, axis: int) -> list[str]:
        """What `node` (a Concat along `axis`) joins, through Concats along the same
        axis whose result only it reads."""
        parts = []
        for name in node.input:
            inner = self.producer.get(name)
            if inner is not None and inner.op_type == "Concat" and _axis(inner) == axis and \
                    len(self.read_by.get(name, [])) == 1 and name not in self.outputs:
                parts += self._concatenated(inner, axis)
            else:
                parts.append(name)
        return parts

    def _states_read_elsewhere(self, segment: Segment, read: set[str]) -> None:
        """Give each step's h and the last c that something still reads its value."""
        cells = segment.cells
        lstm = next(n for n in self.new_nodes if n.output[0] == segment.outputs[0])
        for slot, name in ((1, cells[-1].h), (2, cells[-1].c)):
            if name in read:
                if self.shapes[segment.outputs[slot]] == cells[-1].shape:
                    lstm.output[slot] = name
                else:
                    self.reshaped(segment.outputs[slot], cells[-1].shape, name)
        for step, cell in enumerate(cells[:-1]):
            if cell.h in read:
                index = self.add_constant("step", numpy.asarray(step, dtype=numpy.int64))
                state = self.shapes[segment.outputs[1]]  # Gather's: Y [T, 1, B, H] at one step
                one = cell.h if state == cell.shape else self.fresh("h")
                self.add("Gather", [segment.outputs[0], index], [one], axis=0)
                if one != cell.h:
                    self.shapes[one] = state
                    self.reshaped(one, cell.shape, cell.h)


def _axis(node: Any) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 0)


def _topological(nodes: list[Any], graph: Any, initializers: list[Any]) -> list[Any] | None:
    """`nodes` in an order where each reads only what is made before it (stable)."""
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | \
        {t.name for t in initializers} | {""}
    waiting, ordered = list(nodes), []
    while waiting:
        still = []
        for node in waiting:
            if set(node.input) <= ready:
                ordered.append(node)
                ready.update(node.output)
            else:
                still.append(node)
        if len(still) == len(waiting):
            return None  # a cycle or a value nobody makes: leave the model as it was
        waiting = still
    return ordered


def _live(nodes: list[Any] | None, outputs: set[str]) -> list[Any] | None:
    """`nodes` (in topological order) without those whose results nothing reads."""
    if nodes is None:
        return None
    needed, kept = set(outputs), []
    for node in reversed(nodes):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(node.input)
    return kept[::-1]
