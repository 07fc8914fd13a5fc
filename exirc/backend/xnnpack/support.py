"""XnnpackSupport: which Backend-dialect nodes ExecuTorch 1.5.1's XNNPACK
delegate can run, and why the others cannot.

The checks run in a fixed order, so a node gets the most basic reason:
"op" (XNNPACK has no operator for it, and it cannot be built from ones it
has), "dtype" (float32, and pt2e's int8 quantized tensors), "shape"
(non-empty, of rank <= 6, dynamic dims only where XNNPACK resizes the
operator: `support_dynamic`), then "constraint" (an argument XNNPACK's
operator cannot take, from `support_rules`). A node it takes is one `serializer.py`
has an emitter for; a test keeps the two tables in step. Quantized graphs
(pt2e's quantize/dequantize nodes) are judged group by group: see
`support_quant`. A dynamically quantized linear layer (8da4w / 8da8w:
`dynamic_linear`) is taken whole, its per-token quantize and its weight's
dequantize with it, as the shapes of its layer allow; so is a weight-only
quantized one whose weights are per output channel.
"""

from __future__ import annotations

import operator

import torch
from torch.export import ExportedProgram
from torch.fx import Graph, Node

from exirc.backend.delegation.interface import Rejection
from exirc.backend.xnnpack import qdq
from exirc.backend.xnnpack.args import CREATORS, created
from exirc.backend.xnnpack.dynamic_linear import match_dynamic_linear, match_weight_only_linear
from exirc.backend.xnnpack.lower_shape import SPLITS
from exirc.backend.xnnpack.patterns import match_prelu
from exirc.backend.xnnpack.sizes import concrete, may_be_empty
from exirc.backend.xnnpack.support_dynamic import dynamic_reason, has_dynamic_shape
from exirc.backend.xnnpack.support_nn import NN_RULES, convolution_geometry
from exirc.backend.xnnpack.support_quant import QUANT_RULES, decide, is_quantized_graph
from exirc.backend.xnnpack.support_rules import RULES, Facts, Reason, Rule, op_name
from exirc.edge.constants import constant_tensor

aten = torch.ops.aten
BACKEND_ID = "XnnpackBackend"
MAX_RANK = 6  # XNN_MAX_TENSOR_DIMS
MULTI_OUTPUT = (torch.ops.aten._native_batch_norm_legit_no_training.default,
                torch.ops.aten.max_pool2d_with_indices.default,
                torch.ops.aten.native_layer_norm.default,
                torch.ops.aten.native_group_norm.default)
ALL_RULES: dict[object, Rule] = {**RULES, **NN_RULES, **QUANT_RULES}
"""Every Edge operator XnnpackSupport may take, with its constraints."""


class XnnpackSupport:
    """Backend-dialect node -> None (XNNPACK runs it) or a Rejection saying why not.

    In a quantized graph the answers are decided for the whole graph at once
    (`support_quant`) and kept until the graph changes."""

    backend_id = BACKEND_ID

    def __init__(self) -> None:
        self._decided: tuple[Graph, int, dict[Node, Reason] | None] | None = None
        self._dynamic: tuple[Graph, int, dict[Node, Node]] | None = None
        self._lower: dict[object, int] = {}  # each size symbol's lower bound

    def check(self, node: Node, program: ExportedProgram) -> Rejection | None:
        facts = Facts(lambda n: _constant(program, n))
        # An unbounded symbol is no size (a start position read with `item`).
        self._lower = {s: int(r.lower) for s, r in program.range_constraints.items()
                       if isinstance(r.lower, int) or getattr(r.lower, "is_Integer", False)}
        root = self._dynamic_linears(program, facts).get(node)
        if root is not None:  # judged as its layer: the float input and result
            found = _shape(root, facts)
            return None if found is None else Rejection(node, found[0], found[1])
        decided = self._decisions(program, facts)
        if decided is not None and node in decided:
            found = decided[node]
        else:
            found = self._reason(node, facts)
        return None if found is None else Rejection(node, found[0], found[1])

    def _decisions(self, program: ExportedProgram, facts: Facts) -> dict[Node, Reason] | None:
        graph = program.graph_module.graph
        if self._decided is None or self._decided[0] is not graph \
                or self._decided[1] != len(graph.nodes):
            decided = decide(program.graph_module, facts, self._reason, self._quantized) \
                if is_quantized_graph(program.graph_module) else None
            self._decided = (graph, len(graph.nodes), decided)
        return self._decided[2]

    def _dynamic_linears(self, program: ExportedProgram, facts: Facts) -> dict[Node, Node]:
        """Every node of a dynamically or weight-only quantized linear layer -> the
        layer's root."""
        graph = program.graph_module.graph
        if self._dynamic is None or self._dynamic[0] is not graph \
                or self._dynamic[1] != len(graph.nodes):
            members: dict[Node, Node] = {}
            for node in graph.nodes:
                match = (match_dynamic_linear(node, facts.constant)
                         or match_weight_only_linear(node, facts.constant)) \
                    if node.op == "call_function" else None
                if match is not None:
                    members.update({n: node for n in (node, *match.absorbed)})
            self._dynamic = (graph, len(graph.nodes), members)
        return self._dynamic[2]

    def _quantized(self, node: Node, facts: Facts) -> Reason:
        """A node of a quantized group: its shapes (and a convolution's geometry)."""
        if qdq.is_q(node) or qdq.is_dq(node):
            return _shape(node, facts)
        found = _dtype(node, facts) or _shape(node, facts)
        if found is None and node.target == aten.convolution.default:
            return convolution_geometry(node)
        return found

    def _reason(self, node: Node, facts: Facts) -> tuple[str, str] | None:
        if node.op != "call_function":
            return "op", f"{node.op} nodes are not operators"
        if node.target == operator.getitem:
            return self._getitem(node, facts)
        if node.target in (aten.where.self, aten.gt.Scalar):
            return self._prelu(node, facts)
        if node.target in CREATORS:
            fill = node.args[0] if node.target == aten.scalar_tensor.default else node.args[1]
            if isinstance(fill, Node):  # a size read at run time (scalars_to_tensors)
                return "shape", f"{op_name(node)} computes with the size {fill.name}"
            return _dtype(node, facts) or _shape(node, facts)  # folded at compile time
        rule = ALL_RULES.get(node.target)
        if rule is None:
            return "op", f"XNNPACK has no operator for {op_name(node)}"
        found = _dtype(node, facts) or _shape(node, facts, self._lower)
        if found is None and has_dynamic_shape(node):
            found = dynamic_reason(node)
        return found or rule(node, facts)

    def _prelu(self, node: Node, facts: Facts) -> tuple[str, str] | None:
        """where and gt are taken as parts of a decomposed PReLU only, judged
        as its multiply (the same input and result)."""
        root = node if node.target == aten.where.self else next(iter(node.users), None)
        match = match_prelu(root, facts.constant) if root is not None else None
        if match is not None and (node is root or node in match.absorbed):
            return self._reason(match.absorbed[1], facts)
        if root is None or not _looks_like_prelu(root, node):
            # A mask's select (an attention guard's where): nothing to do with PReLU.
            return "op", f"XNNPACK has no operator for {op_name(node)}"
        return "op", (f"XNNPACK has no operator for {op_name(node)} (taken only as part "
                      "of PReLU: where(x > 0, x, w * x) with w constant per channel)")

    def _getitem(self, node: Node, facts: Facts) -> tuple[str, str] | None:
        source = node.args[0]
        if isinstance(source, Node) and source.target in SPLITS:
            return self._reason(source, facts)
        if not isinstance(source, Node) or source.target not in MULTI_OUTPUT:
            return "op", "only getitems of splits, batch norm, max pooling or layer/group norm " \
                         "are taken"
        if node.args[1] != 0:
            return "constraint", (f"output {node.args[1]} of {op_name(source)} is used; "
                                  "XNNPACK computes output 0 only")
        return self._reason(source, facts)


def _looks_like_prelu(root: Node, node: Node) -> bool:
    """`where(x > c, x, y)` with `node` its where or its comparison: a PReLU
    that missed (its slope not constant per channel, a threshold not 0)."""
    if root.target != aten.where.self or len(root.args) != 3:
        return False
    condition, x, _ = root.args
    return isinstance(condition, Node) and condition.target == aten.gt.Scalar \
        and condition.args[0] is x and node in (root, condition)


def _constant(program: ExportedProgram, node: Node) -> torch.Tensor | None:
    """A weight of the program, or a tensor a creation op makes."""
    tensor = constant_tensor(program, node)
    return tensor if tensor is not None else created(node)


def _vals(node: Node) -> list[object]:
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        # Multi-output ops: output 0 is what XNNPACK computes (the others,
        # e.g. max pooling's int64 indices, are checked to be unused).
        return [val[0]] if node.target in MULTI_OUTPUT else list(val)
    return [val]


def _dtype(node: Node, facts: Facts) -> tuple[str, str] | None:
    for val in _vals(node):
        if isinstance(val, torch.Tensor) and val.dtype != torch.float32:
            return "dtype", f"{op_name(node)} computes {val.dtype}; XNNPACK here runs float32 only"
    for arg in node.all_input_nodes:
        val = arg.meta.get("val")
        # Constants of another dtype (an integer scalar made a tensor) are
        # converted at compile time, as PyTorch converts them when computing.
        if isinstance(val, torch.Tensor) and val.dtype != torch.float32 \
                and not facts.is_constant(arg):
            return "dtype", (f"input {arg.name} of {op_name(node)} is {val.dtype}; "
                             "XNNPACK here runs float32 only")
    return None


def _shape(node: Node, facts: Facts, lower: dict[object, int] | None = None
           ) -> tuple[str, str] | None:
    """Shapes XNNPACK takes: rank <= 6, never empty; dynamic dims only given
    their symbols' `lower` bounds (then `support_dynamic` judges the
    operator): ExecuTorch's XNNPACK runtime fails a call with an empty input,
    so a dim whose range starts at 0 stays on the interpreter."""
    tensors = [(f"input {a.name}", a.meta.get("val")) for a in node.all_input_nodes
               if not facts.is_constant(a)]
    tensors += [("its result", v) for v in _vals(node)]
    for name, val in tensors:
        if not isinstance(val, torch.Tensor):
            continue
        if lower is None and not all(isinstance(d, int) for d in val.shape):
            return "shape", (f"{name} has a dynamic shape {list(val.shape)}; this kind of "
                             "node is built for static shapes only")
        empty = None if lower is None else may_be_empty(val, lower)
        if empty is not None:
            return "shape", (f"{name} may be empty: its dim {empty} can be 0, and XNNPACK "
                             "takes no empty tensors; give the dim min=1 "
                             "(torch.export.Dim(..., min=1, max=...))")
        if val.dim() > MAX_RANK:
            return "shape", f"{name} has rank {val.dim()}; XNNPACK takes at most {MAX_RANK}"
        if 0 in concrete(val.shape):
            return "shape", f"{name} is empty {list(val.shape)}; XNNPACK takes no empty tensors"
    return None
