"""Constant folding: compute at compile time what depends only on constants.

A linear layer's `permute_copy` of its weight, for example, depends only on
the parameter; ExecuTorch's pipeline leaves it to run on every call. Here it
becomes a new constant holding the permuted weight, and the original
parameter is dropped by dead-code elimination if nothing else reads it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch.fx import GraphModule, Node
from torch.utils._pytree import tree_map_only

from exirc.edge.constants import add_constant, constant_tensor, input_target
from exirc.ir.control_flow import (
    ConstantThreader,
    is_control_flow,
    placeholders,
    subgraphs,
    whole_operands,
)
from exirc.ir.meta import constant_name
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram


# Folding results this small never matters for file size.
_SMALL_BYTES = 256
# A value computed only from tensors made from nothing (`arange`, `full`: a
# causal mask, position ids) is stored up to this size: above it, the few
# instructions that rebuild it cost less than the file space.
_FROM_NOTHING_BYTES = 64 << 10
# Ops whose result has no defined contents: never computed at compile time.
_UNDEFINED_CONTENTS = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                                 "new_empty_strided"})


def _is_foldable_op(target: Any) -> bool:
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if target.namespace == "quantized_decomposed":
        return False  # a dequantized weight is 4x its quantized one: keep the small form
    if target.overloadpacket.__name__ in _UNDEFINED_CONTENTS:
        return False
    tags = target.tags
    # Random ops must run every call. Ops that create tensors from nothing
    # (full, arange, ...) fold, so that what is computed from them folds too.
    return torch.Tag.nondeterministic_seeded not in tags and not target._schema.is_mutable


@dataclass(frozen=True)
class ConstantFold(Pass):
    """Edge -> Edge: replace constant-only subgraphs with constants.

    A node folds when it is a deterministic ATen op whose tensor inputs are
    all constants (or folded nodes). Only the frontier (folded nodes that a
    non-folded node reads) becomes new constants, and only when each is at
    most `max_bytes` and no bigger than the constants it is computed from,
    so folding never blows up the file: a broadcast of a weight (`expand`,
    `repeat`, and what is computed from one) runs at run time instead.
    """

    name: ClassVar[str] = "constant_fold"
    max_bytes: int = 1 << 24

    def run(self, program: ExportedProgram) -> PassResult:
        root = program.graph_module
        values: dict[Node, torch.Tensor] = {}
        bound: dict[Node, Node] = {}  # a subgraph's placeholder -> the operand it receives
        for node in root.graph.nodes:
            if node.op == "placeholder":
                tensor = constant_tensor(program, node)
                if tensor is not None:
                    values[node] = tensor
        self._evaluate_graph(root, values, bound)

        from_constants = _from_constants(values, bound)
        self._keep_big_values_from_nothing_at_run_time(values, from_constants)
        self._keep_growing_ops_at_run_time(values, bound, from_constants)
        threader = ConstantThreader(root, functools.partial(add_constant, program))
        changed: dict[int, GraphModule] = {}
        for node, value in values.items():
            if node.op == "placeholder":
                continue
            readers = [user for user in node.users if user not in values]
            if not readers or value.nbytes > self.max_bytes:
                continue
            module = node.graph.owning_module
            assert module is not None
            # In a loop body this also saves the work on every iteration.
            replacement = threader.node_in(module, f"fold:{id(node)}", f"_folded_{node.name}",
                                           value.contiguous(),
                                           described=_described(program, node, bound))
            replacement.meta["stack_trace"] = node.meta.get("stack_trace")
            node.replace_all_uses_with(replacement, delete_user_cb=lambda u: u not in values)
            changed[id(module)] = module
        for module in changed.values():
            module.graph.eliminate_dead_code()
            module.recompile()
        return PassResult(program, bool(changed))

    def _evaluate_graph(self, module: GraphModule, values: dict[Node, torch.Tensor],
                        bound: dict[Node, Node]) -> None:
        """Fold what can be in `module` and its subgraphs; a subgraph's
        placeholder is constant when the whole operand it stands for is."""
        for node in module.graph.nodes:
            if is_control_flow(node):
                for sub, operands in zip(subgraphs(module, node), whole_operands(node)):
                    for placeholder, operand in zip(placeholders(sub), operands):
                        if isinstance(operand, Node) and operand in values:
                            values[placeholder] = values[operand]
                            bound[placeholder] = operand
                    self._evaluate_graph(sub, values, bound)
            elif node.op == "call_function" and _is_foldable_op(node.target):
                folded = self._evaluate(node, values, self.max_bytes)
                if folded is not None:
                    values[node] = folded

    @staticmethod
    def _keep_big_values_from_nothing_at_run_time(values: dict[Node, torch.Tensor],
                                                  from_constants: set[Node]) -> None:
        """Unfold values over `_FROM_NOTHING_BYTES` that no constant of the program
        contributes to (an `arange` of a million and what is computed from it)."""
        for node in reversed(list(values)):
            if node not in from_constants and values[node].nbytes > _FROM_NOTHING_BYTES:
                del values[node]

    @staticmethod
    def _keep_growing_ops_at_run_time(values: dict[Node, torch.Tensor], bound: dict[Node, Node],
                                      from_constants: set[Node]) -> None:
        """Unfold values bigger than the constants they are computed from
        (`expand`, `repeat`, and what is computed from a broadcast): storing
        them would grow the file to save a cheap copy.

        A value's *basis* is what storing it costs at the least: its own
        bytes, or, when it grew, the bases of its inputs. Growth is judged
        against the basis, so it is caught wherever it happens in a chain:
        `expand(w) * 2` is as big as the expand it multiplies, but 16 times
        the weight `w` it comes from, and both run at run time on `w`.
        Values made from nothing keep the rule of their direct inputs (their
        own size cap is `_FROM_NOTHING_BYTES`).
        """
        basis: dict[Node, int] = {}
        grown: list[Node] = []
        for node, value in values.items():  # in evaluation order: inputs first
            if node.op == "placeholder":
                operand = bound.get(node)
                basis[node] = basis.get(operand, value.nbytes) if operand is not None \
                    else value.nbytes
                continue
            inputs = [a for a in node.all_input_nodes if a in values]
            if node in from_constants:
                source = sum(basis[a] for a in inputs)
            else:
                source = sum(values[a].nbytes for a in inputs)
            if value.nbytes > max(source, _SMALL_BYTES):
                grown.append(node)
                basis[node] = source
            else:
                basis[node] = value.nbytes
        # A grown value's folded inputs become the frontier instead.
        for node in grown:
            del values[node]

    @staticmethod
    def _evaluate(node: Node, values: dict[Node, torch.Tensor],
                  max_bytes: int) -> torch.Tensor | None:
        # A node without inputs (`arange(8)`) has static arguments only: a SymInt
        # argument is an input node, computed at run time.
        if any(a not in values for a in node.all_input_nodes):
            return None
        if not node.all_input_nodes and _declared_bytes(node) > max_bytes:
            return None  # `zeros(50000, 50000)`: never allocated by the compiler
        args, kwargs = tree_map_only(Node, lambda n: values[n], (node.args, node.kwargs))
        with torch.no_grad():
            result = node.target(*args, **kwargs)  # type: ignore[operator]
        return result if isinstance(result, torch.Tensor) else None


def _from_constants(values: dict[Node, torch.Tensor], bound: dict[Node, Node]) -> set[Node]:
    """The folded values a constant of the program contributes to (the rest are
    made from nothing: `arange`, `full`). `values` is in evaluation order, so
    each node's inputs are seen first."""
    found: set[Node] = set()
    for node in values:
        if node.op == "placeholder":
            if node not in bound or bound[node] in found:
                found.add(node)
        elif any(a in found for a in node.all_input_nodes):
            found.add(node)
    return found


def _declared_bytes(node: Node) -> int:
    """The size export recorded for the node's result (0 when it recorded none)."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return 0
    return int(value.numel()) * value.element_size()


def _described(program: ExportedProgram, node: Node, bound: dict[Node, Node]) -> str:
    """`fc1.weight (permute_copy)`: the constants a folded node was computed
    from, and its op, for the size report."""
    sources: list[str] = []
    seen: set[Node] = set()
    todo = [node]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in bound:
            todo.append(bound[current])
        elif current.op == "placeholder":
            name = constant_name(current) or input_target(program, current)
            if name and name not in sources:
                sources.append(name)
        else:
            todo.extend(current.all_input_nodes)
    op = getattr(node.target, "__name__", str(node.target)).split(".")[0]
    return f"{' + '.join(sorted(sources)) or 'constants'} ({op})"
