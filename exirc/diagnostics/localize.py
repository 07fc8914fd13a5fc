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
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.export.graph_signature import InputKind
from torch.fx import GraphModule, Interpreter, Node

from exirc.diagnostics.compare import Difference, Tolerance, compare, preview
from exirc.ir.source import source_location
from exirc.plan.alloc import is_alloc
from exirc.plan.control_flow import OUT_FORM_OPS, cond_out, is_out_form, out_form_subgraphs
from exirc.runtime.kernels import KernelRegistry, operator_key
from exirc.serialize import program as P

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from exirc.runtime.loader import LoadedProgram

PLANNED = "planned"  # the culprit disagrees with torch running the planned graph
CAPTURED = "captured"  # the planned graph disagrees with the captured model


@dataclass(frozen=True)
class Divergence:
    """The first instruction whose result differs from its reference."""

    method: str
    instruction: int  # index in chain 0
    op: str  # "aten::relu.out"
    node: str  # the graph node it was made for
    source: str | None  # "model.py:14: return torch.relu(x)"
    module: str | None  # "block.fc (Linear)"
    difference: Difference
    actual: str  # a preview of the first values
    expected: str
    against: str = PLANNED
    execution: int = 1  # which run of the instruction (> 1 in loops)
    loop: str | None = None  # the innermost loop around it: "%map_out at model.py:9: ..."
    captured_op: str | None = None  # with CAPTURED: what the captured node computed

    def lines(self) -> list[str]:
        """The report, a line per fact."""
        if self.against == PLANNED:
            head = f"first diverging instruction: {self.instruction} {self.op} (node %{self.node})"
        else:
            head = (f"first node a pass changed: %{self.node}, instruction {self.instruction} "
                    f"{self.op} (captured as {self.captured_op})")
        lines = [head]
        if self.loop is not None:
            lines.append(f"inside the loop {self.loop}, on execution {self.execution}")
        lines.append(f"source: {self.source or 'unknown'}")
        if self.module is not None:
            lines.append(f"module: {self.module}")
        reference = ("torch's kernels on the same inputs" if self.against == PLANNED
                     else "the captured model")
        lines.append(f"vs {reference}: {self.difference.describe()}")
        lines.append(f"got      {self.actual}")
        lines.append(f"expected {self.expected}")
        return lines


class LocalizeError(Exception):
    """Torch could not run a node of the planned graph; the message is one line."""


def describe_failure(error: BaseException) -> str:
    """One line for a failure to localize: `ValueError: first line of its message`."""
    first = (str(error).strip().splitlines() or [""])[0]
    return first if isinstance(error, LocalizeError) else f"{type(error).__name__}: {first}"


def first_divergence(program: LoadedProgram, method: str, planned: ExportedProgram,
                     instruction_nodes: Sequence[Node], inputs: Sequence[torch.Tensor],
                     tolerance: Tolerance, kernels: KernelRegistry,
                     captured: Callable[[], GraphModule | None] | None = None
                     ) -> Divergence | None:
    """The first instruction of `method` whose result differs from the reference
    (see the module docstring); None if none does."""
    reference = record_planned(planned, inputs)
    context = _Context(planned.graph_module)
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
# The reference: the planned graph, run by torch.
# ---------------------------------------------------------------------------

Recorded = dict[Node, list[Any]]


def record_planned(planned: ExportedProgram, inputs: Sequence[torch.Tensor]) -> Recorded:
    """Each node's values (one per execution) when torch runs the planned graph."""
    module = planned.graph_module
    args = _placeholder_values(planned, inputs)
    sizes = _bind_sizes(module, args)
    values: Recorded = {}
    with torch.no_grad():
        _Recorder(module, values, sizes).run(*args)
    return values


def _placeholder_values(planned: ExportedProgram, inputs: Sequence[torch.Tensor]) -> list[Any]:
    user = iter(inputs)
    values = []
    for spec in planned.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            values.append(next(user))
        elif spec.target in planned.constants:
            values.append(planned.constants[spec.target])
        else:
            values.append(planned.state_dict[str(spec.target)])
    return values


def _bind_sizes(module: GraphModule, args: Sequence[Any]) -> dict[Any, int]:
    """Symbol -> size, from the inputs' actual shapes (for allocs of symbolic shape)."""
    import sympy

    sizes: dict[Any, int] = {}
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, args):
        fake = node.meta.get("val")
        if not isinstance(fake, torch.Tensor) or not isinstance(value, torch.Tensor):
            continue
        for dim, size in zip(fake.shape, value.shape):
            if isinstance(dim, torch.SymInt) and isinstance(dim.node.expr, sympy.Symbol):
                sizes[dim.node.expr] = int(size)
    return sizes


class _Recorder(Interpreter):
    """Runs a planned graph (or a subgraph of it) and records node values.

    `alloc` nodes get memory of the actual sizes; control-flow nodes run their
    subgraphs through recorders too, so nodes inside branches and loop bodies
    are recorded on every execution.
    """

    def __init__(self, module: GraphModule, values: Recorded, sizes: dict[Any, int]) -> None:
        super().__init__(module)
        self.values = values
        self.sizes = sizes

    def run_node(self, n: Node) -> Any:
        if is_alloc(n):
            fake = n.meta["val"]
            return torch.empty([self._size(d) for d in fake.shape], dtype=fake.dtype)
        try:
            value = super().run_node(n)
        except LocalizeError:
            raise  # from a node of a subgraph, already named
        except Exception as error:
            target = str(n.target) if isinstance(n.target, (str, torch._ops.OpOverload)) \
                else getattr(n.target, "__name__", str(n.target))
            raise LocalizeError(f"torch cannot run node %{n.name} ({target}) of the "
                                f"planned graph: {describe_failure(error)}") from error
        if n.op == "call_function":
            self.values.setdefault(n, []).append(value)
        return value

    def call_function(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if target in OUT_FORM_OPS:
            args = tuple(self._recording(a) if isinstance(a, GraphModule) else a for a in args)
        elif isinstance(target, torch._ops.OpOverload):
            kwargs = _schema_kwargs(target, kwargs)
        return super().call_function(target, args, kwargs)

    def _recording(self, module: GraphModule) -> Callable[..., Any]:
        def run(*operands: Any) -> Any:
            return _Recorder(module, self.values, self.sizes).run(*operands)
        return run

    def _size(self, dim: Any) -> int:
        if not isinstance(dim, torch.SymInt):
            return int(dim)
        try:
            return int(dim.node.expr.xreplace(self.sizes))
        except (TypeError, ValueError):
            return 0  # a size known only at run time: the out= kernel resizes it


def _schema_kwargs(target: torch._ops.OpOverload, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` without those `target`'s schema does not take.

    An out-variant node keeps the tensor options of the functional call it
    was made from (`arange(..., dtype=f32, layout=..., out=%alloc)`,
    `_to_copy(x, dtype=f16, out=%alloc)`): the out tensor decides them, so the
    out overload takes none, and the emitter leaves them out too.
    """
    names = {argument.name for argument in target._schema.arguments}
    if all(name in names for name in kwargs):
        return kwargs
    return {name: value for name, value in kwargs.items() if name in names}


# ---------------------------------------------------------------------------
# The program, observed.
# ---------------------------------------------------------------------------


class _Context:
    """Where nodes sit: the control-flow node around each subgraph."""

    def __init__(self, root: GraphModule) -> None:
        self.root = root
        self.enclosing: dict[torch.fx.Graph, Node] = {}
        self._walk(root)

    def _walk(self, owner: GraphModule) -> None:
        for node in owner.graph.nodes:
            if is_out_form(node):
                for sub in out_form_subgraphs(owner, node):
                    self.enclosing[sub.graph] = node
                    self._walk(sub)

    def outer(self, node: Node) -> Iterator[Node]:
        """The control-flow nodes around `node`, innermost first."""
        while node.graph in self.enclosing:
            node = self.enclosing[node.graph]
            yield node

    def source(self, node: Node) -> str | None:
        # Nodes in subgraphs often carry only traced frames: use the enclosing call's.
        for candidate in (node, *self.outer(node)):
            where = source_location(candidate)
            if where is not None:
                return where
        return None

    def module(self, node: Node) -> str | None:
        for candidate in (node, *self.outer(node)):
            stack = candidate.meta.get("nn_module_stack")
            if stack:
                path, kind = list(stack.values())[-1]
                name = kind.__name__ if isinstance(kind, type) else str(kind).rsplit(".", 1)[-1]
                return f"{path or '<root>'} ({name})"
        return None

    def loop(self, node: Node) -> Node | None:
        """The innermost map or while loop around `node`, if any."""
        return next((around for around in self.outer(node) if around.target is not cond_out),
                    None)

    def describe(self, node: Node) -> str:
        where = self.source(node)
        return f"%{node.name}" + (f" at {where}" if where else "")


def _comparable(node: Node) -> bool:
    """A node whose instruction computes its value (not plumbing)."""
    return (node.op == "call_function" and not is_alloc(node) and not is_out_form(node)
            and node.target is not operator.getitem)


def _observe(program: LoadedProgram, method: str, instruction_nodes: Sequence[Node],
             inputs: Sequence[torch.Tensor], reference: Recorded, context: _Context,
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
                        captured: dict[str, Any], context: _Context,
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
