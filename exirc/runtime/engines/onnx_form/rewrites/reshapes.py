"""Fewer Reshape nodes in a finished ONNX model: the same results, bit for bit.

XNNPACK graphs of transformers reshape all the time (a layer norm runs on
[tokens, C, 1, 1], attention heads on [heads, tokens, D]), and each emitted
STATIC_RESHAPE is an ONNX Reshape that onnxruntime runs as a node of its own
(~0.5-2 us each on small tensors). `simplify_reshapes` takes the model
`onnx_graph._model` makes (static shapes, no subgraphs) and rewrites its
graph in place, until nothing changes:

1. a Reshape of a Reshape nothing else reads is one Reshape to the final shape;
2. a Reshape to its input's own shape is dropped (its readers read the input);
3. Reshape(S -> T) -> LayerNormalization(axis k) -> Reshape: the norm runs on
   the Reshape's input over the axis j whose groups are the same elements
   (prod(S[:j]) == prod(T[:k])), its constant scale and bias reshaped to S[j:],
   so that only one Reshape remains (and rule 2 drops it if it is S -> S);
   not after an Add that onnxruntime would then fuse into the norm (see
   `ReshapeRewriter._would_fuse_with_its_add`);
4. a Reshape, a chain of elementwise nodes that do not care about shape (unary
   ones, or binary ones with a one-element constant), and a Reshape: one
   Reshape moves to the other side of the chain, where the two are one;
5. a MatMul between Reshapes that flatten and restore its batch dims runs on
   those dims (`onnx_batched_matmul`).

No rewrite lets onnxruntime fuse two nodes a Reshape kept apart into a kernel
that computes in another order (`FUSES_WITH`, and a norm after a residual Add).

A value read by anything else, a graph output in the middle of a pattern, or a
shape that shape inference cannot tell exactly (unknown, symbolic, empty)
leaves that pattern as it was: every rewrite moves whole elements around
without changing any arithmetic, so the results are exactly the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import TYPE_CHECKING

import numpy

from exirc.runtime.engines.onnx_form.graph_index import (
    GraphIndex,
    Shape,
    static_shapes,
    until_fixed_point,
)
from exirc.runtime.engines.onnx_form.rewrites.batched_matmul import matmul_on_batch_dims

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

UNARY = frozenset({"Abs", "Ceil", "Celu", "Clip", "Cos", "Elu", "Erf", "Exp", "Floor", "Gelu",
                   "HardSigmoid", "HardSwish", "Identity", "LeakyRelu", "Log", "Neg",
                   "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin",
                   "Softplus", "Softsign", "Sqrt", "Tanh"})
"""Ops computing each output element from the same input element alone (Clip's
bounds are scalars by definition)."""
BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"})
"""Broadcasting ops: elementwise only when the other operand has one element."""
_MATMULS = frozenset({"MatMul", "Gemm", "Transpose"})  # Transpose: onnxruntime folds it in
FUSES_WITH = {"Mul": _MATMULS, "Div": _MATMULS, "MatMul": frozenset({"Mul", "Div"}),
              "Gemm": frozenset({"Mul", "Div"}),
              "Add": frozenset({"LayerNormalization", "Gelu", "Softmax"})}
"""Producer -> readers that onnxruntime (ORT_ENABLE_ALL) fuses into one kernel doing
the arithmetic in another order once they meet: a scale into a MatMul's alpha
(MatMulScaleFusion), a bias into SkipLayerNormalization, BiasGelu or BiasSoftmax.
No rewrite makes such a pair meet: the results would move in the last bits."""


def simplify_reshapes(model: ModelProto) -> int:
    """Rewrite `model`'s graph in place with fewer Reshapes (rules in the module
    docstring); how many rewrites it made. Takes and returns a static-shape ONNX
    model without subgraphs; one whose shapes cannot be inferred exactly is left
    as it is."""
    shapes = static_shapes(model)
    if shapes is None:
        return 0  # shapes we cannot be sure of: nothing is rewritten
    rewriter = ReshapeRewriter(model, shapes)
    # Each rewrite removes a Reshape or moves a norm above one: this many always end it.
    steps = until_fixed_point(rewriter.step, 4 * len(model.graph.node) + 1)
    rewriter.finish()
    return steps


class ReshapeNode:
    """A node's op type, inputs and outputs as Python lists (protobuf fields are slow
    to read again and again); `proto` gets them back in `ReshapeRewriter.finish`."""

    def __init__(self, proto: NodeProto) -> None:
        self.proto = proto
        self.op_type: str = proto.op_type
        self.input: list[str] = list(proto.input)
        self.output: list[str] = list(proto.output)


class ReshapeRewriter(GraphIndex[ReshapeNode]):
    """The graph's nodes with who reads and makes each value; one rewrite a `step`."""

    def __init__(self, model: ModelProto, shapes: dict[str, Shape]) -> None:
        import onnx

        super().__init__(model.graph, [ReshapeNode(proto) for proto in model.graph.node], tag="rs")
        self.onnx = onnx
        self.shapes = shapes
        self._scalars_of: dict[str, str] = {}  # a one-element constant -> its rank-0 copy

    # -- bookkeeping -----------------------------------------------------------

    def _new_constant(self, stem: str, array: numpy.ndarray) -> str:
        name = self.add_constant(stem, array)
        self.shapes[name] = tuple(array.shape)
        return name

    def _reshape_to(self, node: ReshapeNode, source: str, shape: Shape) -> None:
        """Make `node` (a Reshape) read `source` and reshape it to `shape`."""
        node.input[0] = source
        node.input[1] = self._new_constant("shape", numpy.asarray(shape, dtype=numpy.int64))
        self.shapes[node.output[0]] = shape
        del node.proto.attribute[:]  # allowzero is moot: no shape here has a 0

    def _plain_reshape(self, node: ReshapeNode) -> bool:
        return (node.op_type == "Reshape" and node.input[0] in self.shapes
                and node.output[0] in self.shapes)

    # -- rewrites ---------------------------------------------------------------

    def step(self) -> bool:
        """Apply one rewrite somewhere; False when none applies any more."""
        self.refresh()
        for node in self.nodes:
            if not self._plain_reshape(node):
                continue
            if (self._merge(node) or self._drop(node) or self._norm_on_source(node)
                    or self._move_chain(node) or matmul_on_batch_dims(self, node)):
                return True
        return False

    def _merge(self, second: ReshapeNode) -> bool:
        """Rule 1: Reshape(Reshape(x)) -> Reshape(x) when the middle value has no
        other reader."""
        first = self.made_by(second.input[0], "Reshape")
        if first is None or self.sole_reader(second.input[0]) is None or \
                first.input[0] not in self.shapes:
            return False
        self._reshape_to(second, first.input[0], self.shapes[second.output[0]])
        self.nodes.remove(first)
        return True

    def _drop(self, node: ReshapeNode) -> bool:
        """Rule 2: a Reshape to its input's own shape is gone (not a graph output)."""
        source, target = node.input[0], node.output[0]
        if self.shapes[source] != self.shapes[target] or target in self.outputs or \
                self._fuses(self.producer(source), self.readers(target)):
            return False
        for reader in self.readers(target):
            for i, name in enumerate(reader.input):
                if name == target:
                    reader.input[i] = source
        self.nodes.remove(node)
        return True

    def _norm_on_source(self, reshape: ReshapeNode) -> bool:
        """Rule 3: Reshape(x: S -> T) -> LayerNormalization -> Reshape becomes the
        norm on x (same groups of elements), then one Reshape."""
        norm_input = reshape.output[0]
        norm = self.sole_reader(norm_input)
        if norm is None or norm.op_type != "LayerNormalization" or \
                norm.input[0] != norm_input or len(norm.output) != 1:
            return False
        (normed,) = norm.output
        after = self.sole_reader(normed)
        if after is None or after.op_type != "Reshape":
            return False
        if self._would_fuse_with_its_add(reshape.input[0]):
            return False
        source, target = self.shapes[reshape.input[0]], self.shapes[norm_input]
        if not target:
            return False
        axis = next((a.i for a in norm.proto.attribute if a.name == "axis"), -1) % len(target)
        groups = prod(target[:axis])
        axes = [j for j in range(len(source)) if prod(source[:j]) == groups]
        weights = [self.constant(name) for name in norm.input[1:] if name]
        if not axes or any(w is None or tuple(w.shape) != target[axis:] for w in weights):
            return False
        new_axis = axes[-1]
        for slot, weight in enumerate(weights, start=1):  # scale, then bias if any
            assert weight is not None
            norm.input[slot] = self._new_constant(
                "ln_weight", weight.reshape(source[new_axis:]))
        for attribute in norm.proto.attribute:
            if attribute.name == "axis":
                attribute.i = new_axis
        if not any(a.name == "axis" for a in norm.proto.attribute):
            norm.proto.attribute.append(self.onnx.helper.make_attribute("axis", new_axis))
        norm.input[0] = reshape.input[0]
        norm.output[0] = self.fresh(normed)
        self.shapes[norm.output[0]] = source
        # The Reshape moves below the norm, where rule 1 meets the one after it.
        self._reshape_to(reshape, norm.output[0], target)
        reshape.output[0] = normed
        self.nodes.remove(reshape)
        self.nodes.insert(self.nodes.index(norm) + 1, reshape)
        return True

    def _would_fuse_with_its_add(self, value: str) -> bool:
        """Whether a LayerNormalization reading `value` would meet onnxruntime's
        SkipLayerNormFusion: an Add of two 3-D values of one shape, read by nothing
        else. Its fused kernel sums and normalises in another order (results differ
        in the last bits) and ran slower here (bert: 60 -> 65 us), so the norm stays
        behind its Reshape; unknown shapes count as fusing."""
        add = self.made_by(value, "Add")
        if add is None or self.sole_reader(value) is None:
            return False
        shapes = [self.shapes.get(name) for name in add.input]
        return None in shapes or (shapes[0] == shapes[1] and len(shapes[0] or ()) == 3)

    def _move_chain(self, last: ReshapeNode) -> bool:
        """Rule 4: Reshape -> shape-agnostic elementwise chain -> Reshape: one Reshape
        moves to the other's side of the chain, where they are one. The last moves
        above the chain, unless the chain would then meet its reader in a fusion
        (`_fuses`); else the first moves below it."""
        chain: list[ReshapeNode] = []  # from the last node up
        value = last.input[0]
        while self.sole_reader(value) is not None:
            node = self.producer(value)
            if node is None or (variable := self._elementwise_operand(node)) is None:
                break
            chain.append(node)
            value = variable
        first = self.made_by(value, "Reshape")
        if not chain or first is None or self.sole_reader(value) is None:
            return False
        source, target = first.input[0], last.output[0]
        if not self._fuses(chain[0], self.readers(target)):
            shape = self.shapes[target]  # the chain runs on the final shape
            self._reshape_to(first, source, shape)
            chain[0].output[0] = target
            self.nodes.remove(last)
        elif not self._fuses(self.producer(source), [chain[-1]]):
            shape = self.shapes[source]  # the chain runs on the first one's input
            chain[-1].input[chain[-1].input.index(value)] = source
            self._reshape_to(last, last.input[0], self.shapes[target])
            self.nodes.remove(first)
        else:
            return False
        self._fit_constants(chain, len(shape))
        for node in chain:
            self.shapes[node.output[0]] = shape
        return True

    @staticmethod
    def _fuses(producer: ReshapeNode | None, readers: Sequence[ReshapeNode]) -> bool:
        """Whether onnxruntime's optimizer would fuse `producer` with one of `readers`
        into a kernel with other arithmetic if no Reshape stood between them."""
        fusing = FUSES_WITH.get(producer.op_type, frozenset()) if producer else frozenset()
        return any(reader.op_type in fusing for reader in readers)

    def _elementwise_operand(self, node: ReshapeNode) -> str | None:
        """The one computed input of an elementwise node whose other inputs have one
        element each; None for any other node."""
        if len(node.output) != 1 or node.output[0] not in self.shapes:
            return None
        if node.op_type in UNARY:
            variable, others = node.input[0], node.input[1:]
        elif node.op_type in BINARY and len(node.input) == 2:
            constants = [name for name in node.input if self.initializer(name) is not None]
            if len(constants) != 1:
                return None
            (variable,) = [name for name in node.input if name not in constants]
            others = constants
        else:
            return None
        if any(name and ((tensor := self.initializer(name)) is None or prod(tensor.dims) != 1)
               for name in others):
            return None
        return variable if self.shapes.get(variable) == self.shapes[node.output[0]] else None

    def _fit_constants(self, chain: list[ReshapeNode], rank: int) -> None:
        """Give each one-element operand of `chain` with a rank above `rank` a rank-0
        copy, so that broadcasting it does not grow the moved node's output."""
        for node in chain:
            for slot, name in enumerate(node.input):
                tensor = self.initializer(name)
                if node.op_type in BINARY and tensor is not None and len(tensor.dims) > rank:
                    if name not in self._scalars_of:
                        array = self.constant(name)
                        assert array is not None
                        self._scalars_of[name] = self._new_constant("scalar", array.reshape(()))
                    node.input[slot] = self._scalars_of[name]

    def finish(self) -> None:
        """Write the nodes back; drop initializers nothing reads any more."""
        for node in self.nodes:
            node.proto.input[:] = node.input
            node.proto.output[:] = node.output
        self.write_back(node.proto for node in self.nodes)
