"""Fewer nodes for boolean reductions in a fused chain: the same values, bit for bit.

torch's safe softmax (attention without a mask) sets rows that are all -inf
to 0: `where(logical_not(any(logical_not(x == -inf), -1)), 0, softmax(x))`.
Translated kernel by kernel (`onnx_chain_ops`, which reduces the bools
themselves) it is Equal, Not, ReduceMax, Not, Where around the Softmax, and
onnxruntime runs each as a kernel of its own (~0.5-1 us). A reduction over
the floats themselves would be cheaper, but onnxruntime's ReduceMax drops a
NaN unless it is a row's last element, so "the row's max is -inf" is not
"the row is all -inf". `simplify_bool_reductions` takes a finished ONNX
model without subgraphs and rewrites, until nothing changes:

1. ReduceMax(Not(e)) -> Not(ReduceMin(e)), ReduceMin(Not(e)) ->
   Not(ReduceMax(e)) on bools (any(not e) is not all(e), also over nothing);
2. Not(Not(a)): its readers read a;
3. Where(Not(c), a, b) -> Where(c, b, a);

each only where the values it removes are read by nothing else and are no
graph output. The guard becomes Equal, ReduceMin, Where: exact for every
input, NaN and infinities included (tests/runtime/engines/onnx_form/test_softmax_guard.py
compares it with the guard reduced as int32 on onnxruntime, bit for bit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exirc.runtime.engines.onnx_form.graph_index import (
    GraphIndex,
    has_subgraphs,
    until_fixed_point,
)

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

BOOL_MAKERS = frozenset({"Not", "And", "Or", "Xor", "Equal", "Less", "LessOrEqual", "Greater",
                         "GreaterOrEqual", "IsNaN", "IsInf"})
"""Ops whose output is bool whatever their inputs."""
REDUCTIONS = {"ReduceMax": "ReduceMin", "ReduceMin": "ReduceMax"}  # each one's De Morgan dual
_BOOL = 9  # onnx.TensorProto.BOOL


def simplify_bool_reductions(model: ModelProto) -> int:
    """Rewrite `model`'s graph in place (rules in the module docstring); how many
    rewrites it made. Takes and returns an ONNX model (opset 18+) without
    subgraphs; the graph is replaced only at the end, so an error leaves it as it was."""
    graph = model.graph
    if not {"ReduceMax", "ReduceMin"} & {node.op_type for node in graph.node}:
        return 0
    if has_subgraphs(graph):
        return 0
    if any(o.domain in ("", "ai.onnx") and o.version < 18 for o in model.opset_import):
        return 0  # bool reductions need opset 18's ReduceMax/ReduceMin
    rewriter = _Rewriter(model)
    # De Morgan moves a Not below one reduction (each Not passes each reduction at most
    # once, downstream); the other rules remove Nots.
    nots = sum(node.op_type == "Not" for node in graph.node)
    steps = until_fixed_point(rewriter.step, nots * (len(graph.node) + 1))
    if steps:
        rewriter.write_back(rewriter.nodes)
    return steps


class _Rewriter(GraphIndex["NodeProto"]):
    """The graph's nodes as a list to rewrite, who makes and who reads each value."""

    def __init__(self, model: ModelProto) -> None:
        import onnx

        super().__init__(model.graph, model.graph.node, tag="dual")
        self.onnx = onnx
        self.bool_inputs = {i.name for i in model.graph.input
                            if i.type.tensor_type.elem_type == _BOOL}

    def step(self) -> bool:
        """Apply one rewrite anywhere; False when none applies."""
        for node in self.nodes:
            if node.op_type in REDUCTIONS and self._de_morgan(node):
                return True
            if node.op_type == "Not" and self._double_not(node):
                return True
            if node.op_type == "Where" and self._swap_where(node):
                return True
        return False

    def only_read_by(self, name: str, reader: NodeProto) -> bool:
        return self.sole_reader(name) is reader

    def is_bool(self, name: str) -> bool:
        node = self.producer(name)
        if node is None:
            return name in self.bool_inputs
        if node.op_type == "Cast":
            return _attribute(node, "to") == _BOOL
        return node.op_type in BOOL_MAKERS or (node.op_type in REDUCTIONS and
                                               self.is_bool(node.input[0]))

    def replace(self, old: list[NodeProto], new: list[NodeProto]) -> None:
        """`new` where the last of `old` was (its inputs are made before), `old` gone."""
        gone = {id(node) for node in old}
        at = max(i for i, node in enumerate(self.nodes) if id(node) in gone)
        self.refresh([*[n for n in self.nodes[:at] if id(n) not in gone], *new,
                      *[n for n in self.nodes[at + 1:] if id(n) not in gone]])

    def node(self, template: NodeProto, op_type: str, inputs: list[str],
             outputs: list[str]) -> NodeProto:
        """A new node with `template`'s attributes."""
        made = self.onnx.helper.make_node(op_type, inputs, outputs, name=template.name)
        made.attribute.extend(template.attribute)
        return made

    def _de_morgan(self, reduce: NodeProto) -> bool:
        """Rule 1, from the reduction of a Not."""
        negate = self.made_by(reduce.input[0], "Not")
        if negate is None or not self.only_read_by(negate.output[0], reduce) or \
                not self.is_bool(negate.input[0]):
            return False
        dual = self.fresh(reduce.output[0])
        self.replace([negate, reduce], [
            self.node(reduce, REDUCTIONS[reduce.op_type], [negate.input[0], *reduce.input[1:]],
                      [dual]),
            self.onnx.helper.make_node("Not", [dual], list(reduce.output))])
        return True

    def _double_not(self, outer: NodeProto) -> bool:
        """Rule 2, from the outer Not."""
        inner = self.made_by(outer.input[0], "Not")
        name = outer.output[0]
        if inner is None or not self.only_read_by(inner.output[0], outer) or \
                name in self.outputs:
            return False
        kept = inner.input[0]
        self.replace([inner, outer], [])
        self.refresh([self._renamed(node, name, kept) for node in self.nodes])
        return True

    def _renamed(self, node: NodeProto, old: str, new: str) -> NodeProto:
        if old not in node.input:
            return node
        return self.node(node, node.op_type, [new if n == old else n for n in node.input],
                         list(node.output))

    def _swap_where(self, where: NodeProto) -> bool:
        """Rule 3."""
        negate = self.made_by(where.input[0], "Not")
        if negate is None or not self.only_read_by(negate.output[0], where):
            return False
        condition, a, b = where.input
        self.replace([negate, where], [self.node(where, "Where", [negate.input[0], b, a],
                                                 list(where.output))])
        return True


def _attribute(node: NodeProto, name: str) -> Any:
    return next((a.i for a in node.attribute if a.name == name), None)
