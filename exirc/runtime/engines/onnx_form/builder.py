"""Making ONNX graphs: new nodes and initializers, and the XNNPACK graph being built.

`OnnxNodes` makes ONNX nodes and initializers (weights as numpy arrays, copied
into the model) under fresh names: the delegates' forms (`OnnxBuilder`), the
fused chains (`chain`) and the rewrites that add nodes (`graph_index`) all
make them through it. `OnnxBuilder` is the pieces `xnnpack_graph` and
`xnnpack_nodes` share while each XNNPACK node is emitted; value `id` is named
`v<id>` so that the delegate's inputs and outputs keep recognisable names.
`onnx` itself is imported only when a builder is made (a delegate is being
converted), never when exirc's runtime is imported.
"""

from __future__ import annotations

from typing import Any

import numpy
import torch

from exirc.runtime.delegates.xnnpack.context import CLAMPED_KINDS
from exirc.serialize.xnnpack import graph as G


class NotMapped(Exception):
    """The graph has something the ONNX form does not express exactly."""


def value_name(value_id: int) -> str:
    return f"v{value_id}"


class OnnxNodes:
    """New ONNX nodes and initializers, collected in order; each value a node or
    initializer makes without a given name is named `fresh(stem)`: `<stem>_<tag><n>`
    for the next n that is not `taken` (a rewrite passes the names its graph has
    already; a graph built from nothing has none). The one place nodes are made."""

    def __init__(self, tag: str = "", taken: set[str] | None = None) -> None:
        import onnx.helper
        import onnx.numpy_helper

        self.helper = onnx.helper
        self.numpy_helper = onnx.numpy_helper
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._tag = tag
        self._taken = set() if taken is None else taken
        self._counter = 0

    def fresh(self, stem: str) -> str:
        while True:
            self._counter += 1
            name = f"{stem}_{self._tag}{self._counter}"
            if name not in self._taken:
                self._taken.add(name)
                return name

    def array(self, stem: str, array: numpy.ndarray) -> str:
        """A new initializer holding `array`; its name."""
        name = self.fresh(stem)
        self.initializers.append(self.numpy_helper.from_array(array, name))
        return name

    def floats(self, stem: str, numbers: list[float], shape: tuple[int, ...] = ()) -> str:
        return self.array(stem, numpy.asarray(numbers, dtype=numpy.float32).reshape(shape))

    def ints(self, stem: str, numbers: list[int]) -> str:
        return self.array(stem, numpy.asarray(numbers, dtype=numpy.int64))

    def node(self, op_type: str, inputs: list[str], outputs: list[str] | None = None,
             **attributes: Any) -> str:
        """Append a node; its (first) output name, made up when not given."""
        outputs = outputs or [self.fresh(op_type.lower())]
        self.nodes.append(self.helper.make_node(op_type, inputs, outputs, **attributes))
        return outputs[0]


class OnnxBuilder(OnnxNodes):
    """Collects ONNX nodes and initializers while the graph's nodes are emitted."""

    def __init__(self, graph: G.XNNGraph, constants: dict[int, torch.Tensor],
                 shapes: dict[int, tuple[int, ...]]) -> None:
        super().__init__()
        self.graph = graph
        self.values = {v.id_out: v for v in graph.values}
        self.constants = constants
        self.shapes = shapes  # inferred dims by value id (`CompiledGraph.shapes`)
        self._named: set[str] = set()

    # -- values and constants ------------------------------------------------

    def read(self, value_id: int) -> str:
        """The name of a value a node reads: a constant becomes an initializer once."""
        name = value_name(value_id)
        constant = self.constant(value_id)
        if constant is not None and name not in self._named:
            self._named.add(name)
            self.initializers.append(self.numpy_helper.from_array(constant, name))
        return name

    def constant(self, value_id: int) -> numpy.ndarray | None:
        """A constant value's data, or None when the value is computed."""
        tensor = self.constants.get(value_id)
        return None if tensor is None else tensor.numpy()

    def rank(self, value_id: int) -> int:
        """The value's rank as the shape check inferred it; NotMapped if it did not."""
        dims = self.shapes.get(value_id)
        if dims is None:
            raise NotMapped(f"value {value_id}'s dims were not inferred")
        return len(dims)

    def plain_float32(self, value_id: int) -> bool:
        """Whether value `value_id` exists and is float32, not quantized."""
        value = self.values.get(value_id)
        return value is not None and value.datatype == G.Datatype.FP32 and value.quant is None

    def require_constant(self, value_id: int, role: str) -> numpy.ndarray:
        array = self.constant(value_id)
        if array is None:
            raise NotMapped(f"its {role} is computed at run time")
        return array

    # -- nodes ---------------------------------------------------------------

    def clamp(self, source: str, bounds: tuple[float, float] | None, target: str) -> str:
        """`target` = `source` clamped to `bounds` (Relu for [0, inf), as ORT fuses it)."""
        if bounds is None:
            return self.node("Identity", [source], [target])
        low, high = bounds
        if low == 0.0 and high == float("inf"):
            return self.node("Relu", [source], [target])
        return self.node("Clip", [source, self.floats("low", [low]),
                                 self.floats("high", [high])], [target])

    def to_nchw(self, name: str) -> str:
        return self.node("Transpose", [name], perm=[0, 3, 1, 2])

    def to_nhwc(self, name: str, target: str) -> str:
        return self.node("Transpose", [name], [target], perm=[0, 2, 3, 1])


def clamp_bounds(node: G.Node) -> tuple[float, float] | None:
    """The node's fused output clamp, as `context.NodeContext.clamp_bounds` reads it
    (already checked there: not NaN, not empty)."""
    if node.kind not in CLAMPED_KINDS or node.output_min_max is None:
        return None
    low, high = node.output_min_max
    if low == float("-inf") and high == float("inf"):
        return None
    return float(low), float(high)
