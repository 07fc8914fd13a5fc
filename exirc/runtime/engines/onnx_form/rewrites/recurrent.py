"""What rewriting unrolled recurrent cells into one ONNX recurrent node needs,
whatever the cell: the graph's index with its values' shapes (`CellGraph`), new
nodes and constants, the steps' inputs joined into the node's X, Concats of
all the steps' h made Reshapes of Y, and the graph written back in a
topological order without dead nodes.

A matched run of cells (a segment) is anything with `cells` (each with `h`,
`x`, `shape`, `batch`, `width` and the `body` nodes it replaces) and
`outputs` (the new node's Y, Y_h, ...); see `onnx_gru`. Takes and writes a
static-shape ONNX model without subgraphs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod
from typing import TYPE_CHECKING, Any, Protocol

import numpy

from exirc.runtime.engines.onnx_form.graph_index import GraphIndex, Shape, static_shapes

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto


class StepShape:
    """A matched step's `width` (H) and `batch` (B), from `shape`: its h's [.., H]."""

    shape: Shape

    @property
    def width(self) -> int:
        return self.shape[-1]

    @property
    def batch(self) -> int:
        return prod(self.shape) // self.width


class StepLike(Protocol):
    """One matched time step."""

    h: str
    x: str
    shape: Shape
    body: list[Any]

    @property
    def batch(self) -> int: ...

    @property
    def width(self) -> int: ...


class SegmentLike(Protocol):
    """A run of steps that is one recurrent node."""

    outputs: list[str]

    @property
    def cells(self) -> Sequence[StepLike]: ...


class CellGraph(GraphIndex["NodeProto"]):
    """The graph's index (who makes and reads each value, its constants) and the
    shapes inference gave its values: what the cell matchers read."""

    def __init__(self, model: ModelProto, shapes: dict[str, Shape]) -> None:
        super().__init__(model.graph, model.graph.node, tag="rnn")
        self.shapes = shapes


class RecurrentRewriter(CellGraph):
    """New nodes and constants replacing matched segments (`made`), and the graph
    rewritten. Subclasses say what node a segment becomes (`emit`) and how states
    still read elsewhere are given their values (`states_read_elsewhere`)."""

    def reshaped(self, name: str, shape: Shape, target: str | None = None) -> str:
        """`name` as `shape` (a Reshape, or a reshaped constant; itself if it is one)."""
        if self.shapes.get(name) == shape and target is None:
            return name
        array = self.constant(name)
        if array is not None and target is None:
            return self.add_constant("state", array.reshape(shape))
        shape_name = self.add_constant("shape", numpy.asarray(shape, dtype=numpy.int64))
        return self.made.node("Reshape", [name, shape_name], [target or self.fresh("reshape")])

    def emit(self, segment: Any) -> None:
        raise NotImplementedError

    def states_read_elsewhere(self, segment: Any, read: set[str]) -> None:
        raise NotImplementedError

    def rewrite(self, segments: Sequence[SegmentLike]) -> bool:
        """Replace each segment's nodes by its recurrent node and write the graph back;
        False (graph untouched) if the result would not be a valid order."""
        removed = {id(node) for segment in segments for step in segment.cells
                   for node in step.body}
        for segment in segments:
            self.emit(segment)
        for segment in segments:
            removed |= self.concats_as_reshapes(segment)
        kept = [node for node in self.nodes if id(node) not in removed]
        read = {name for node in (*kept, *self.made.nodes) for name in node.input} | self.outputs
        for segment in segments:
            self.states_read_elsewhere(segment, read)  # (may make more nodes)
        nodes = live(topological(kept + self.made.nodes, self.graph, self.made.initializers),
                     self.outputs)
        if nodes is None:
            return False
        self.write_back(nodes)
        return True

    def sequence(self, segment: SegmentLike, features: int) -> str:
        """X: the steps' x as [T, B, features]; the tensor they were split from if
        they are its parts in order (each maybe through a Reshape), else a Concat."""
        steps = segment.cells
        shape = (len(steps), steps[0].batch, features)
        sources = []
        for step in steps:
            node = self.producer(step.x)
            sources.append(node.input[0] if node is not None and node.op_type == "Reshape"
                           else step.x)
        split = self.producer(sources[0])
        if split is not None and split.op_type == "Split" and list(split.output) == sources and \
                axis_of(split) == 0 and \
                self.shapes.get(split.input[0], (0,))[0] == len(sources) and \
                prod(self.shapes[split.input[0]]) == prod(shape):
            return self.reshaped(split.input[0], shape)
        parts = [self.reshaped(step.x, (1, *shape[1:])) for step in steps]
        if len(parts) == 1:
            return parts[0]
        return self.made.node("Concat", parts, [self.fresh("X")], axis=0)

    def concats_as_reshapes(self, segment: SegmentLike) -> set[int]:
        """Concats of all the segment's h, in order or in reverse (a bidirectional
        layer's backward direction), along an axis with only 1s before it, made
        Reshapes of Y (of Y backwards, a Slice with step -1); their ids. A Concat
        may be a chain of Concats (XNNPACK joins at most a few at a time): the
        inner ones, read by nothing else, are left for `live` to drop."""
        hs = [step.h for step in segment.cells]
        shape = segment.cells[0].shape
        done = set()
        for node in self.nodes:
            if node.op_type != "Concat" or node.output[0] not in self.shapes:
                continue
            axis = axis_of(node)
            parts = self._concatenated(node, axis)
            if prod(shape[:axis % len(shape)]) != 1 or parts not in (hs, hs[::-1]):
                continue
            y = segment.outputs[0] if parts == hs else self._backwards(segment.outputs[0])
            self.reshaped(y, self.shapes[node.output[0]], node.output[0])
            done.add(id(node))
        return done

    def gather_step(self, y: str, step: int, state: Shape, shape: Shape, target: str) -> None:
        """`target` (of `shape`) = Y [T, 1, B, H] at `step` (a Gather giving `state`)."""
        index = self.add_constant("step", numpy.asarray(step, dtype=numpy.int64))
        one = target if state == shape else self.fresh("h")
        self.made.node("Gather", [y, index], [one], axis=0)
        if one != target:
            self.shapes[one] = state
            self.reshaped(one, shape, target)

    def _backwards(self, y: str) -> str:
        """`y` reversed along axis 0: a Slice from its last element back past the first."""
        bounds = {"start": -1, "end": numpy.iinfo(numpy.int64).min, "axis": 0, "step": -1}
        constants = [self.add_constant(stem, numpy.asarray([value], numpy.int64))
                     for stem, value in bounds.items()]
        reversed_y = self.made.node("Slice", [y, *constants], [self.fresh("Y_backwards")])
        self.shapes[reversed_y] = self.shapes[y]
        return reversed_y

    def _concatenated(self, node: NodeProto, axis: int) -> list[str]:
        """What `node` (a Concat along `axis`) joins, through Concats along the same
        axis whose result only it reads."""
        parts = []
        for name in node.input:
            inner = self.producer(name)
            if inner is not None and inner.op_type == "Concat" and axis_of(inner) == axis and \
                    self.sole_reader(name) is not None:
                parts += self._concatenated(inner, axis)
            else:
                parts.append(name)
        return parts


def shapes_if_any(model: ModelProto, needed: set[str]) -> dict[str, Shape] | None:
    """The static shapes of `model` if it has every op type in `needed` (a cell
    needs them all) and they can be told (`static_shapes`); else None (and no time
    spent inferring)."""
    if not needed <= {node.op_type for node in model.graph.node}:
        return None
    return static_shapes(model)


def segments_of_chains(cells: Sequence[Any], successors: dict[int, list[Any]],
                       segment: Callable[[list[Any], int], Any]) -> list[Any]:
    """Cells linked into chains (each cell's `previous`, each cell's followers in
    `successors` by id) cut into segments: from each chain's head, `segment(chain,
    start)` gives the longest segment from `start` (None: that cell starts none)."""
    segments = []
    for head in cells:
        if head.previous is not None and len(successors[id(head.previous)]) == 1:
            continue  # not the first of its chain
        chain = [head]
        while len(successors.get(id(chain[-1]), [])) == 1:
            chain.append(successors[id(chain[-1])][0])
        start = 0
        while start < len(chain):
            found = segment(chain, start)
            start += len(found.cells) if found else 1
            if found:
                segments.append(found)
    return segments


def axis_of(node: Any) -> int:
    """A node's `axis` attribute (0 if it has none)."""
    return next((a.i for a in node.attribute if a.name == "axis"), 0)


def topological(nodes: list[Any], graph: Any, initializers: list[Any]) -> list[Any] | None:
    """`nodes` in an order where each reads only what is made before it (stable);
    None if there is none (a cycle or a value nobody makes)."""
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
            return None
        waiting = still
    return ordered


def live(nodes: list[Any] | None, outputs: set[str]) -> list[Any] | None:
    """`nodes` (in topological order) without those whose results nothing reads."""
    if nodes is None:
        return None
    needed, kept = set(outputs), []
    for node in reversed(nodes):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(node.input)
    return kept[::-1]
