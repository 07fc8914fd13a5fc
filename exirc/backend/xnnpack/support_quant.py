"""What XnnpackSupport takes of a quantized graph, decided for the whole graph at once.

Each node still gets its own answer, but in a quantized graph some depend on
each other:

  - a quantize (Q) is taken when XNNPACK can hold its result as qint8, a
    dequantize (DQ) when it reads such a Q with the same parameters. Q and DQ
    normally land in one delegate, where they cost nothing or one Convert; where
    the graph puts them in two (an operator XNNPACK lacks between their users),
    the qint8 tensor passes between the delegates, as in ExecuTorch's payloads;
  - a convolution or linear layer whose weight is dequantized runs as a
    quantized XNNPACK node when its whole group is taken (`qdq_gemm.Gemm`: the DQ
    of its activation, its weight, the Q of its result), and the weight's
    dequantize only then. Otherwise a linear layer runs in float32 on the
    weight dequantized outside (as before quantized groups were taken), and a
    convolution, whose filter XNNPACK needs constant, is left out.

Every other operator is judged as before: between a DQ and a Q it runs on
the integers where XNNPACK computes what PyTorch does (the emitters decide),
and in float32 between Convert nodes otherwise, which is exact.

Which nodes end up in the same partition is the partitioner's choice, so the
decision runs torch's capability-based partitioner on what it would take,
and leaves out the weight of any quantized group the partitions would split
(its layer then runs in float32 or not at all), until none is split.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from exirc.backend.xnnpack import qdq, qdq_gemm
from exirc.backend.xnnpack.support_rules import Facts, Reason, Rule
from exirc.ir.control_flow import is_control_flow

Judge = Callable[[Node, Facts], Reason]


def is_quantized_graph(graph_module: GraphModule) -> bool:
    return any(qdq.is_q(n) or qdq.is_weight_dq(n) for n in graph_module.graph.nodes)


def decide(graph_module: GraphModule, facts: Facts, judge: Judge,
           judge_quantized: Judge) -> dict[Node, Reason]:
    """Every call's answer (getitems excepted). `judge` answers for an operator on its
    own, `judge_quantized` for the shapes (and geometry) of a Q, DQ or quantized GEMM."""
    calls = [n for n in graph_module.graph.nodes
             if n.op == "call_function" and n.target is not operator.getitem]
    forced: dict[Node, Reason] = {}
    while True:
        rules = _Rules(facts, judge, judge_quantized, forced)
        reasons = {n: rules.reason(n) for n in calls}
        taken = {n for n, r in reasons.items() if r is None and _structurally_taken(n)}
        found = {n: r for n, r in _split_groups(graph_module, taken, facts).items()
                 if n not in forced}
        if not found:
            return reasons
        forced.update(found)


class _Rules:
    """The answers of one round, with the nodes earlier rounds left out forced out."""

    def __init__(self, facts: Facts, judge: Judge, judge_quantized: Judge,
                 forced: Mapping[Node, Reason]) -> None:
        self.facts, self.judge, self.forced = facts, judge, forced
        self.judge_quantized = judge_quantized
        self.memo: dict[Node, Reason] = {}

    def taken(self, node: Node) -> bool:
        return self.reason(node) is None

    def reason(self, node: Node) -> Reason:
        if node not in self.memo:
            self.memo[node] = self.forced.get(node) or self._reason(node)
        return self.memo[node]

    def _reason(self, node: Node) -> Reason:
        facts = self.facts
        if qdq.is_q(node):
            return quantize(node, facts) or self.judge_quantized(node, facts)
        if qdq.is_dq(node) and not facts.is_constant(node.args[0]):
            return self._dequantize(node) or self.judge_quantized(node, facts)
        if self._is_weight(node) or (node.target == torch.ops.aten.permute_copy.default
                                     and self._is_weight(node.args[0])):
            found = self._weight(node)
            if isinstance(found, str):
                return None  # "fold": a dequantized constant, computed at compile time
            if found is not None and not qdq.is_weight_dq(node):
                return self.judge(node, facts)  # the transpose of a weight left outside
            return found
        gemm = qdq_gemm.match_gemm(node, facts.constant)
        if gemm is None:
            return self.judge(node, facts)
        problem = self._gemm_problem(node)
        if problem is None:
            return self.judge_quantized(node, facts)
        if node.target == torch.ops.aten.convolution.default:
            return "constraint", ("its weight is quantized, but it cannot run as a quantized "
                                  f"XNNPACK node: {problem}")
        # A matrix product of the weight dequantized outside: float32, as before.
        return self.judge(node, facts)

    def _gemm_problem(self, node: Node) -> str | None:
        """Why a GEMM with a dequantized weight cannot run as a quantized node, if it cannot."""
        gemm = qdq_gemm.match_gemm(node, self.facts.constant)
        if gemm is None or isinstance(gemm, str):
            return gemm or "its weight is not quantized"
        for member in gemm.members:
            forced = self.forced.get(member)
            if forced is not None:
                return forced[1]
            if member not in gemm.weight_nodes and not self.taken(member):
                return f"its quantized group needs {member.name}, which XNNPACK leaves out"
        return None

    def _is_weight(self, node: object) -> bool:
        """A dequantize of a constant (a weight, or a constant operand)."""
        return qdq.is_weight_dq(node) and self.facts.is_constant(node.args[0])  # type: ignore

    def _dequantize(self, node: Node) -> Reason:
        problem = qdq.activation_problem(node)
        if problem is not None:
            return "dtype", problem
        q = node.args[0]
        if not qdq.is_q(q):
            return "dtype", (f"it dequantizes {q}, not the result of a quantize; XNNPACK "
                             "takes a dequantize of a quantize's integers only")
        assert isinstance(q, Node)
        if qdq.tensor_params(q) != qdq.tensor_params(node):
            return "constraint", (f"it dequantizes {q.name} with other parameters than "
                                  "it was quantized with")
        return None

    def _weight(self, node: Node) -> Reason | str:
        consumer = qdq_gemm.weight_consumer(node)
        source = node if qdq.is_weight_dq(node) else node.args[0]
        assert isinstance(source, Node)
        if consumer is None:
            if qdq.is_dq(source) and node is source:
                return "fold"
            return "op", ("a dequantized weight is taken only as the weight of a convolution "
                          "or linear layer that runs quantized")
        problem = self._gemm_problem(consumer)
        if problem is None:
            problem = (self.reason(consumer) or ("", ""))[1] or None
        if problem is not None:
            return "constraint", (f"a quantized weight goes with {consumer.name}, which "
                                  f"XNNPACK does not run quantized: {problem}")
        return None


def quantize(node: Node, facts: Facts) -> Reason:
    problem = qdq.activation_problem(node)
    if problem is not None:
        return "dtype", problem
    source = node.args[0]
    val = source.meta.get("val") if isinstance(source, Node) else None
    if not isinstance(val, torch.Tensor) or val.dtype != torch.float32:
        return "dtype", f"it quantizes {getattr(val, 'dtype', source)}; XNNPACK quantizes float32"
    return None


def _structurally_taken(node: Node) -> bool:
    """What the capability partitioner considers at all (its structural checks)."""
    if is_control_flow(node):
        return False
    value = node.meta.get("val")
    results = value if isinstance(value, (list, tuple)) else [value]
    return all(isinstance(v, torch.Tensor) for v in results)


class _Chosen(OperatorSupportBase):
    def __init__(self, taken: set[Node]) -> None:
        self.taken = taken

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: Node) -> bool:
        return node in self.taken


def _split_groups(graph_module: GraphModule, taken: set[Node],
                  facts: Facts) -> dict[Node, Reason]:
    """The weights of the quantized GEMMs whose groups the partitions of `taken` would
    split: such a layer cannot read or write the integers of another delegate."""
    gemms = [(n, g) for n in taken for g in [qdq_gemm.match_gemm(n, facts.constant)]
             if isinstance(g, qdq_gemm.Gemm)]
    if not gemms:
        return {}
    chosen = set(taken)
    for node in graph_module.graph.nodes:
        if node.target is operator.getitem and node.args[0] in taken:
            chosen.add(node)  # as the capability partitioner does
    partitions = CapabilityBasedPartitioner(
        graph_module, _Chosen(chosen), allows_single_node_partition=True).propose_partitions()
    owner = {n: i for i, p in enumerate(partitions) for n in p.nodes}
    found: dict[Node, Reason] = {}
    for node, gemm in gemms:
        if any(owner.get(m) != owner.get(node) for m in gemm.members):
            # Out goes the weight's dequantize: the layer then runs in float32 if it can.
            found[gemm.weight_nodes[0]] = "partition", (
                f"the quantized group of {node.name} (dequantize, weight, quantize) would "
                "be split between delegates")
    return found


def _dequantize_alone(node: Node, facts: Facts) -> Reason:
    if facts.is_constant(node.args[0]):
        return None  # computed at compile time
    problem = qdq.activation_problem(node)
    return None if problem is None else ("dtype", problem)


def _weight_alone(node: Node, facts: Facts) -> Reason:
    weight = qdq_gemm.weight_of(node, facts.constant)
    return ("constraint", weight) if isinstance(weight, str) else None


QUANT_RULES: dict[object, Rule] = {
    qdq.Q_TENSOR: quantize,
    qdq.DQ_TENSOR: _dequantize_alone,
    qdq.DQ_CHANNEL: _weight_alone,
}
"""The quantize and dequantize ops, with what can be said of each alone (the rest,
whether its group is taken, `decide` says)."""
