"""A decomposed tanh-GELU in a finished ONNX model as one `Gelu(approximate="tanh")` node.

GPT-2's `gelu_new`, 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))),
reaches the XNNPACK delegate as nine elementwise nodes, and onnxruntime runs
each as a kernel of its own (~0.5-1 us a node on small tensors; its own
FastGelu fusion does not recognise this form). `fuse_tanh_gelus` takes the
model `onnx_graph._model` makes (static shapes, no subgraphs) and rewrites its
graph in place: each

    u = (x + x * x * x * 0.044715) * sqrt(2/pi);  y = x * (tanh(u) + 1) * 0.5

becomes `y = Gelu(x, approximate="tanh")`, and so does the same function in
its sigmoid form (0.5 * (1 + tanh(z)) = sigmoid(2z)), six nodes, which is how
exirc lowers `F.gelu(x, approximate="tanh")` to XNNPACK:

    y = x * sigmoid(x * (x * x * 2k*0.044715 + 2k))   or
    y = x * sigmoid((x + x * x * x * 0.044715) * 2k),   k = sqrt(2/pi).

Products are matched as products:
their factors in any order and association (x^3 also as Pow(x, 3)), 0.5
applied to x, to (tanh(u) + 1) or to their product; sums in either order.

The pattern is matched strictly: every constant a one-element float32
initializer exactly equal to its value in float32, every intermediate value
read only inside the pattern and not a graph output, y of x's shape (no
broadcast to more dims). Anything else is left as it is. onnxruntime's Gelu
kernel evaluates the same formula in another order: results move in the last
bits (and it may fuse a bias Add before it into BiasGelu, also within them).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy

from exirc.runtime.engines.onnx_form.graph_index import GraphIndex, Shape, static_shapes

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

HALF, ONE, CUBIC = 0.5, 1.0, 0.044715
SCALE = math.sqrt(2.0 / math.pi)  # all compared as float32: torch's arithmetic rounds them so


def fuse_tanh_gelus(model: ModelProto) -> int:
    """Rewrite `model`'s graph in place with each decomposed tanh-GELU as one Gelu
    node (module docstring); how many were rewritten. Takes and returns a
    static-shape ONNX model without subgraphs; one whose shapes cannot be
    inferred is left alone."""
    import onnx

    graph = model.graph
    if not any(node.op_type in ("Tanh", "Sigmoid") for node in graph.node):
        return 0  # nothing to find: skip shape inference
    shapes = static_shapes(model)
    if shapes is None:
        return 0
    matcher = _GeluMatcher(model, shapes)
    replaced: dict[int, NodeProto] = {}  # id of a match's last node -> its Gelu
    removed: set[int] = set()
    for node in graph.node:
        if node.op_type == "Tanh":
            found = matcher.match(node)
        elif node.op_type == "Sigmoid":
            found = matcher.match_sigmoid(node)
        else:
            continue
        if found is None or any(id(n) in removed for n in found.nodes):
            continue
        removed.update(id(n) for n in found.nodes)
        replaced[id(found.last)] = onnx.helper.make_node(
            "Gelu", [found.x], list(found.last.output), approximate="tanh")
    if not replaced:
        return 0
    matcher.write_back(replaced.get(id(node), node) for node in graph.node
                       if id(node) not in removed or id(node) in replaced)
    return len(replaced)


class _Match:
    """One decomposed GELU: its input, its nodes, and the node making its result."""

    def __init__(self, x: str, nodes: list[NodeProto], last: NodeProto) -> None:
        self.x, self.nodes, self.last = x, nodes, last


class _GeluMatcher(GraphIndex["NodeProto"]):
    """Who makes and who reads each value of a model, and the pattern's matching."""

    def __init__(self, model: ModelProto, shapes: dict[str, Shape]) -> None:
        super().__init__(model.graph, model.graph.node)
        self.shapes = shapes

    def is_constant(self, name: str, value: float) -> bool:
        """Whether `name` is a one-element float32 constant equal to `value` in float32."""
        return self.scalar(name) == float(numpy.float32(value))

    def factors(self, name: str, nodes: list[NodeProto], root: bool = False) -> list[str]:
        """The factors of `name` as a product: through each Mul (or Pow to 3) making a
        value read only once (`root`: `name` itself, whoever reads it), appended to `nodes`."""
        node = self.producer(name)
        if node is None or (not root and self.sole_reader(name) is None):
            return [name]
        if node.op_type == "Mul" and len(node.input) == 2:
            nodes.append(node)
            return [*self.factors(node.input[0], nodes), *self.factors(node.input[1], nodes)]
        if node.op_type == "Pow" and len(node.input) == 2 and self.is_constant(node.input[1], 3.0):
            nodes.append(node)
            return [node.input[0]] * 3
        return [name]

    def match(self, tanh: NodeProto) -> _Match | None:
        """The GELU whose Tanh is `tanh`, or None if it is not exactly one."""
        nodes: list[NodeProto] = [tanh]
        scaled = self.factors(tanh.input[0], nodes, root=True)
        sum_name = self._one_besides(scaled, SCALE)
        add = self.producer(sum_name or "")
        if add is None or add.op_type != "Add" or len(add.input) != 2:
            return None
        nodes.append(add)
        x = self._cubic_sum(add, nodes)
        plus_one = self.sole_reader(tanh.output[0])
        if x is None or plus_one is None or plus_one.op_type != "Add" or \
                len(plus_one.input) != 2 or \
                not self.is_constant(_other(plus_one, tanh.output[0]), ONE):
            return None
        nodes.append(plus_one)
        last = self._product(x, plus_one.output[0], nodes)
        if last is None or not self._closed(nodes, last) or x not in self.shapes or \
                self.shapes.get(last.output[0]) != self.shapes[x]:
            return None
        return _Match(x, nodes, last)

    def match_sigmoid(self, sigmoid: NodeProto) -> _Match | None:
        """The GELU whose Sigmoid is `sigmoid` (the sigmoid form), or None."""
        nodes: list[NodeProto] = [sigmoid]
        x = self._sigmoid_argument(sigmoid.input[0], nodes)
        last = self.sole_reader(sigmoid.output[0])
        if x is None or last is None or last.op_type != "Mul":
            return None
        found: list[NodeProto] = []
        if sorted(self.factors(last.output[0], found, root=True)) != \
                sorted([x, sigmoid.output[0]]):
            return None
        nodes.extend(found)
        if not self._closed(nodes, last) or x not in self.shapes or \
                self.shapes.get(last.output[0]) != self.shapes[x]:
            return None
        return _Match(x, nodes, last)

    def _sigmoid_argument(self, name: str, nodes: list[NodeProto]) -> str | None:
        """x, if `name` is x * (x * x * 2k*0.044715 + 2k) or (x + x^3 * 0.044715) * 2k."""
        found: list[NodeProto] = []
        factors = self.factors(name, found, root=True)
        scaled_sum = self.producer(self._one_besides(factors, 2 * SCALE) or "")
        if scaled_sum is not None and scaled_sum.op_type == "Add" and \
                len(scaled_sum.input) == 2:
            x = self._cubic_sum(scaled_sum, found)
            if x is not None:
                nodes.extend([*found, scaled_sum])
                return x
            return None
        if len(factors) != 2:
            return None
        for x, sum_name in (factors, reversed(factors)):
            add = self.producer(sum_name)
            if add is None or add.op_type != "Add" or len(add.input) != 2 or \
                    self.sole_reader(sum_name) is None:
                continue
            for term, constant in (add.input, reversed(add.input)):
                square: list[NodeProto] = []
                if self.is_constant(constant, 2 * SCALE) and \
                        self.sole_reader(term) is not None and \
                        self._is_product(self.factors(term, square), [x, x], 2 * SCALE * CUBIC):
                    nodes.extend([*found, add, *square])
                    return x
        return None

    def _cubic_sum(self, add: NodeProto, nodes: list[NodeProto]) -> str | None:
        """x, if `add` is x + x * x * x * 0.044715 (either order)."""
        for x, term in (add.input, reversed(add.input)):
            found: list[NodeProto] = []
            if x != term and self.sole_reader(term) is not None and \
                    self._is_product(self.factors(term, found), [x, x, x], CUBIC):
                nodes.extend(found)
                return x
        return None

    def _product(self, x: str, plus_one: str, nodes: list[NodeProto]) -> NodeProto | None:
        """The Mul making x * (tanh(u) + 1) * 0.5, one or two Muls below `plus_one`."""
        node = self.sole_reader(plus_one)
        for _ in range(2):
            if node is None or node.op_type != "Mul":
                return None
            found: list[NodeProto] = []
            if self._is_product(self.factors(node.output[0], found, root=True),
                                [x, plus_one], HALF):
                nodes.extend(found)
                return node
            node = self.sole_reader(node.output[0])
        return None

    def _is_product(self, factors: list[str], values: list[str], constant: float) -> bool:
        """Whether `factors` are `values` (any order) and the constant `constant`."""
        rest = list(factors)
        for name in values:
            if name not in rest:
                return False
            rest.remove(name)
        return len(rest) == 1 and self.is_constant(rest[0], constant)

    def _one_besides(self, factors: list[str], value: float) -> str | None:
        """The factor other than the constant `value`, if there are exactly two."""
        if len(factors) != 2:
            return None
        first, second = factors
        if self.is_constant(second, value):
            return first
        return second if self.is_constant(first, value) else None

    def _closed(self, nodes: list[NodeProto], last: NodeProto) -> bool:
        """Every value the nodes make but `last` is read only by them, and no output."""
        members = {id(node) for node in nodes}
        return all(name not in self.outputs and
                   all(id(reader) in members for reader in self.readers(name))
                   for node in nodes if node is not last for name in node.output)


def _other(node: NodeProto, name: str) -> str:
    first, second = node.input
    return second if first == name else first
