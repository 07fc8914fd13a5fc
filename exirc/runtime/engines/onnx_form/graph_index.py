"""What every rewrite of a finished ONNX model reads its graph through, and the loop
that runs a rewrite until it is done.

`GraphIndex` answers, for one graph without subgraphs (a reader inside one
would not be indexed): who makes each value (`producer`), who reads it
(`readers`, one entry per input slot; `reader_count` counts a graph output as
one more), a constant's data as numpy (`constant`, `scalar`), the graph's
inputs and outputs. A rewrite that changes the nodes calls `refresh`; one that
adds nodes or constants names them apart from the graph's (`made`, `fresh`,
`add_constant`) and writes the graph back with `write_back`. Every rule of
`rules` and the TFLite writer read their graphs through it, not through maps
of their own. `static_shapes` gives every value's exact static shape, or
None when they cannot be told; `until_fixed_point` runs a rewrite's `step`
until nothing changes.

Initializers are never changed in place (a rewrite adds new ones), so a
constant is converted to numpy once and then shared, read-only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from math import prod
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import numpy

from exirc.errors import InternalError
from exirc.runtime.engines.onnx_form.builder import OnnxNodes

if TYPE_CHECKING:
    from onnx import GraphProto, ModelProto, NodeProto, TensorProto

Shape = tuple[int, ...]
_FLOAT = 1  # onnx.TensorProto.FLOAT


class NodeLike(Protocol):
    """A node as the index reads it: an ONNX NodeProto, or a rewrite's own copy of
    one (`reshapes._Node` keeps its lists in Python)."""

    @property
    def op_type(self) -> str: ...

    @property
    def input(self) -> Sequence[str]: ...

    @property
    def output(self) -> Sequence[str]: ...


N = TypeVar("N", bound=NodeLike)


class GraphIndex(Generic[N]):
    """Who makes and who reads each value of `graph`'s `nodes`, its constants, inputs
    and outputs. `tag` marks the names `fresh` makes (`<stem>_<tag><n>`)."""

    def __init__(self, graph: GraphProto, nodes: Iterable[N], tag: str = "new") -> None:
        self.graph = graph
        self.inputs = {i.name for i in graph.input}
        self.outputs = {o.name for o in graph.output}
        self.initializers: dict[str, TensorProto] = {t.name: t for t in graph.initializer}
        self.nodes: list[N] = []
        self._tag = tag
        self._made: OnnxNodes | None = None
        self._arrays: dict[str, numpy.ndarray] = {}
        self._scalars: dict[str, float | None] = {}
        self._producer: dict[str, N] = {}
        self._readers: dict[str, list[N]] = {}
        self.refresh(nodes)

    def refresh(self, nodes: Iterable[N] | None = None) -> None:
        """Index the nodes again after a rewrite changed them (`nodes`: a new list;
        None: `self.nodes`, changed in place)."""
        if nodes is not None:
            self.nodes = list(nodes)
        self._producer, self._readers = {}, {}
        for node in self.nodes:
            for name in node.input:
                self._readers.setdefault(name, []).append(node)
            for name in node.output:
                self._producer[name] = node

    # -- values -------------------------------------------------------------------

    def producer(self, name: str) -> N | None:
        """The node making `name` (None for a graph input, a constant or no value)."""
        return self._producer.get(name)

    def made_by(self, name: str, op_type: str) -> N | None:
        """The node making `name`, if it is an `op_type` node."""
        node = self._producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def readers(self, name: str) -> Sequence[N]:
        """The nodes reading `name`, one entry per input slot (a node reading it
        twice is there twice); the graph's outputs are not among them."""
        return self._readers.get(name, ())

    def reader_count(self, name: str) -> int:
        """How many places read `name`: input slots, and one if it is a graph output."""
        return len(self._readers.get(name, ())) + (name in self.outputs)

    def sole_reader(self, name: str) -> N | None:
        """The one node reading `name`, in one slot, if nothing else reads it (it is
        no graph output)."""
        readers = self._readers.get(name)
        if readers is None or len(readers) != 1 or name in self.outputs:
            return None
        return readers[0]

    # -- constants ----------------------------------------------------------------

    def initializer(self, name: str) -> TensorProto | None:
        """The initializer holding `name`'s data, if it is a constant (an initializer
        that is also a graph input is only its default: not a constant)."""
        if name in self.inputs:
            return None
        return self.initializers.get(name)

    def constant(self, name: str) -> numpy.ndarray | None:
        """A constant's data (read-only), or None when `name` is computed or an input."""
        array = self._arrays.get(name)
        if array is not None:
            return array
        tensor = self.initializer(name)
        if tensor is None:
            return None
        from onnx import numpy_helper

        array = numpy_helper.to_array(tensor)
        array.flags.writeable = False
        self._arrays[name] = array
        return array

    def scalar(self, name: str) -> float | None:
        """The value of a one-element float32 constant; None for anything else."""
        if name not in self._scalars:
            tensor = self.initializer(name)
            array = None if tensor is None or tensor.data_type != _FLOAT or \
                prod(tensor.dims) != 1 else self.constant(name)
            self._scalars[name] = None if array is None else float(array.reshape(()))
        return self._scalars[name]

    # -- rewriting ------------------------------------------------------------------

    @property
    def made(self) -> OnnxNodes:
        """The nodes and initializers a rewrite adds, named apart from every name the
        graph has (`write_back` adds the initializers; the nodes are the rewrite's)."""
        if self._made is None:
            graph = self.graph
            taken = {name for node in graph.node for name in (*node.input, *node.output)}
            taken |= set(self.initializers) | self.inputs | self.outputs
            self._made = OnnxNodes(self._tag, taken)
        return self._made

    def fresh(self, stem: str) -> str:
        """A new value name no value of the graph has."""
        return self.made.fresh(stem)

    def add_constant(self, stem: str, array: numpy.ndarray) -> str:
        """A new initializer holding `array`, read by `constant` like the others; its name."""
        name = self.made.array(stem, array)
        self.initializers[name] = self.made.initializers[-1]
        return name

    def write_back(self, nodes: Iterable[NodeProto]) -> None:
        """Make `nodes` the graph's nodes, add the constants made, drop the initializers
        nothing reads any more and the shapes noted for values (some may have changed)."""
        graph, nodes = self.graph, list(nodes)
        del graph.node[:]
        graph.node.extend(nodes)
        if self._made is not None:
            graph.initializer.extend(self._made.initializers)
        read = {name for node in nodes for name in node.input} | self.outputs
        if any(t.name not in read for t in graph.initializer):
            kept = [t for t in graph.initializer if t.name in read]
            del graph.initializer[:]
            graph.initializer.extend(kept)
        del graph.value_info[:]


def has_subgraphs(graph: GraphProto) -> bool:
    """Whether a node of `graph` holds a graph (If, Loop, Scan): readers inside one
    are not indexed, so no rewrite touches such a graph."""
    from onnx import AttributeProto

    kinds = (AttributeProto.GRAPH, AttributeProto.GRAPHS)
    return any(attribute.type in kinds for node in graph.node for attribute in node.attribute)


def static_shapes(model: ModelProto) -> dict[str, Shape] | None:
    """`inferred_shapes(model)`, or None when a rewrite cannot be sure of them: the
    model has subgraphs, or shape inference fails on it."""
    import onnx

    if has_subgraphs(model.graph):
        return None
    try:
        return inferred_shapes(model)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return None


def inferred_shapes(model: ModelProto) -> dict[str, Shape]:
    """Every value's exact static shape (values with unknown or symbolic dims left out).

    Inference runs on a shell of the model whose weights are declared as inputs,
    so that the weights are not copied; int64 initializers (shapes, sizes) stay,
    inference reads their values."""
    import onnx

    graph = model.graph
    kept = [t for t in graph.initializer if t.data_type == onnx.TensorProto.INT64]
    declared = [onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                for t in graph.initializer if t.data_type != onnx.TensorProto.INT64]
    shell = onnx.helper.make_graph(graph.node, graph.name, [*graph.input, *declared],
                                   graph.output, kept)
    shell_model = onnx.helper.make_model(shell, opset_imports=model.opset_import)
    shell_model.ir_version = model.ir_version
    inferred = onnx.shape_inference.infer_shapes(shell_model, strict_mode=True).graph
    shapes: dict[str, Shape] = {}
    for info in [*inferred.value_info, *inferred.input, *inferred.output]:
        tensor = info.type.tensor_type
        if tensor.HasField("shape") and all(d.HasField("dim_value") and d.dim_value > 0
                                            for d in tensor.shape.dim):
            shapes[info.name] = tuple(d.dim_value for d in tensor.shape.dim)
    for initializer in kept:
        shapes[initializer.name] = tuple(initializer.dims)
    return shapes


def until_fixed_point(step: Callable[[], bool], bound: int) -> int:
    """Call `step` (one rewrite somewhere; False when none applies) until nothing
    changes; how many rewrites it made. `bound` is the most the rewrite's
    termination argument allows: one more means that argument is wrong, a bug
    (`InternalError`, which the rule's engine records as its refusal)."""
    for count in range(bound + 1):
        if not step():
            return count
    raise InternalError(f"a rewrite did not reach a fixed point in {bound} steps, the most "
                        "its termination argument allows")
