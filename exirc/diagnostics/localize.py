"""Finding the first instruction whose result is wrong.

When a program's outputs differ from eager PyTorch, two runs on the same
inputs are compared step by step:

  * the reference: the memory-planned graph the program was emitted from,
    run node by node by torch itself (`torch.fx.Interpreter`, with torch's
    own kernels), recording every node's value (per execution, for nodes in
    loop bodies and branches);
  * the program, run by exirc's interpreter with an observer that, after each
    instruction, compares what it wrote with the value its node had in the
    reference.

The first instruction beyond the tolerance is the culprit: its kernel (or
the runtime around it) computes something else than torch does. An
instruction inside a loop is compared on each iteration, and the report names
the loop as well. Control-flow plumbing (jumps, moves, loop counters) is not
compared itself: a fault there shows at the first op that reads its result.

If every instruction agrees with the planned graph, the program does what
the graph says and the graph is what changed: a pass. The planned graph is
then compared with a fresh capture of the model, node by node for the nodes
both have (same name, same source line, same type), to name the first one a
pass changed.

The pieces: `planned_reference` runs the planned graph, `node_context`
says where a node sits (source line, module, loop), `divergence` is what is
found; this module runs the program against them.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.fx import GraphModule, Interpreter, Node

from exirc.diagnostics.compare import Tolerance, compare, preview
from exirc.diagnostics.divergence import CAPTURED, PLANNED, Divergence
from exirc.diagnostics.node_context import NodeContext
from exirc.diagnostics.planned_reference import Recorded, record_planned
from exirc.ir.source import source_location
from exirc.plan.ops import is_alloc, is_out_form
from exirc.runtime.kernels.registry import KernelRegistry, operator_key
from exirc.serialize import program as P

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from exirc.runtime.core.loader import LoadedProgram


def first_divergence(program: LoadedProgram, method: str, planned: ExportedProgram,
                     instruction_nodes: Sequence[Node], inputs: Sequence[torch.Tensor],
                     tolerance: Tolerance, kernels: KernelRegistry,
                     captured: Callable[[], GraphModule | None] | None = None
                     ) -> Divergence | None:
    """The first instruction of `method` whose result differs from the reference
    (see the module docstring); None if none does."""
    reference = record_planned(planned, inputs)
    context = NodeContext(planned.graph_module)
    found = _observe(program, method, instruction_nodes, inputs, reference, context,
                     tolerance, kernels)
    if found is not None or captured is None:
        return found
    module = captured()
    if module is None:
        return None
    return _first_changed_node(program, method, planned, instruction_nodes, reference,
                               _record_names(module, inputs), context, tolerance)


# ---------------------------------------------------------------------------
# The program, observed.
# ---------------------------------------------------------------------------


def _comparable(node: Node) -> bool:
    """A node whose instruction computes its value (not plumbing)."""
    return (node.op == "call_function" and not is_alloc(node) and not is_out_form(node)
            and node.target is not operator.getitem)


def _observe(program: LoadedProgram, method: str, instruction_nodes: Sequence[Node],
             inputs: Sequence[torch.Tensor], reference: Recorded, context: NodeContext,
             tolerance: Tolerance, kernels: KernelRegistry) -> Divergence | None:
    plan = program.program.method(method)
    runner = program.method(method)
    instructions = plan.chains[0].instructions if plan.chains else []
    results = [_result_values(plan, instr, kernels) for instr in instructions]
    executions = [0] * len(instructions)
    found: list[Divergence] = []

    def observe(chain: int, index: int) -> None:
        if chain != 0 or index >= len(instruction_nodes):
            return
        node = instruction_nodes[index]
        values = results[index]
        if values is None or not _comparable(node):
            return
        execution = executions[index]
        executions[index] += 1
        recorded = reference.get(node)
        if recorded is None or execution >= len(recorded):
            return
        actual = _single(_flat([runner.value(v) for v in values]))
        expected = _single(_flat([recorded[execution]]))
        difference = compare(actual, expected, tolerance)
        if not difference.ok:
            loop = context.loop(node)
            found.append(Divergence(
                method, index, _label(plan, instructions[index]), node.name,
                context.source(node), context.module(node), difference,
                preview(actual), preview(expected), PLANNED, execution + 1,
                context.describe(loop) if loop is not None else None))
            raise _Found

    with contextlib.suppress(_Found):  # nothing after the first divergence matters
        runner.run(list(inputs), observer=observe)
    return found[0] if found else None


class _Found(Exception):
    """Raised by the observer to end the run at the first divergence (an observer's
    exceptions reach the caller untouched)."""


def _result_values(plan: P.ExecutionPlan, instr: P.Instruction,
                   kernels: KernelRegistry) -> list[int] | None:
    """The values a kernel call writes: its return slots, else its mutated arguments."""
    if not isinstance(instr, P.KernelCall):
        return None
    op = plan.operators[instr.op_index]
    kernel = kernels.find(op.name, op.overload)
    if kernel is None:
        return None
    arguments = kernel.schema.arguments
    returns = list(instr.args[len(arguments):])
    if returns:
        return returns
    return [instr.args[i] for i, argument in enumerate(arguments)
            if argument.alias_info is not None and argument.alias_info.is_write]


def _label(plan: P.ExecutionPlan, instr: P.Instruction) -> str:
    assert isinstance(instr, P.KernelCall)
    op = plan.operators[instr.op_index]
    return operator_key(op.name, op.overload)


def _flat(values: Sequence[Any]) -> list[Any]:
    flat: list[Any] = []
    for value in values:
        if isinstance(value, (list, tuple)):
            flat.extend(_flat(value))
        else:
            flat.append(value)
    return flat


def _single(values: list[Any]) -> Any:
    """One value as itself, several as a list (so reports say "output", not "item 0")."""
    return values[0] if len(values) == 1 else values

# ---------------------------------------------------------------------------
# The planned graph against a fresh capture: which node did a pass change?
# ---------------------------------------------------------------------------


def _record_names(module: GraphModule, inputs: Sequence[torch.Tensor]) -> dict[str, Any]:
    """The values of the captured graph's top-level nodes, by node name."""
    values: dict[str, tuple[Node, Any]] = {}

    class NameRecorder(Interpreter):
        def run_node(self, n: Node) -> Any:
            value = super().run_node(n)
            if n.op == "call_function":
                values[n.name] = (n, value)
            return value

    with torch.no_grad():
        NameRecorder(module).run(*inputs)
    return values


def _first_changed_node(program: LoadedProgram, method: str, planned: ExportedProgram,
                        instruction_nodes: Sequence[Node], reference: Recorded,
                        captured: dict[str, Any], context: NodeContext,
                        tolerance: Tolerance) -> Divergence | None:
    plan = program.program.method(method)
    instructions = plan.chains[0].instructions if plan.chains else []
    top = planned.graph_module.graph
    for index, node in enumerate(instruction_nodes):
        if node.graph is not top or not _comparable(node) or node.name not in captured:
            continue
        other, expected = captured[node.name]
        recorded = reference.get(node)
        if not recorded or source_location(other) != source_location(node):
            continue
        actual = recorded[0]
        if not _same_kind(actual, expected):
            continue  # a different value under the same name, not a changed one
        difference = compare(actual, expected, tolerance)
        if not difference.ok and isinstance(instructions[index], P.KernelCall):
            return Divergence(method, index, _label(plan, instructions[index]), node.name,
                              context.source(node), context.module(node), difference,
                              preview(actual), preview(expected), CAPTURED,
                              captured_op=str(other.target))
    return None


def _same_kind(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape
    return type(a) is type(b) and not isinstance(a, (list, tuple))
