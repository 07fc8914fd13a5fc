"""One method: an out-variant graph -> an `ExecutionPlan`.

Nodes are emitted in graph order, in the spirit of torch.fx's interpreter:
placeholders become input or constant values, `alloc` nodes planned
tensors, kernel calls `KernelCall` instructions whose args are the schema's
arguments (outs included) followed by the return values, and the output
node the plan's outputs.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import torch
from torch.export.graph_signature import InputKind, TensorArgument
from torch.fx import GraphModule, Node

from exirc.backend.delegation.lowered import DelegateWithOuts, LoweredDelegate
from exirc.emit.constants import ConstantTable
from exirc.emit.delegates import backend_delegate
from exirc.emit.frames import program_frames
from exirc.emit.jumps import emit_control_flow
from exirc.emit.values import ValueTable
from exirc.errors import InternalError, UnsupportedOperatorError, UsageError
from exirc.ir.control_flow import output_values, placeholders
from exirc.ir.meta import attention_report, constant_name, memory_plan, planned_memory, state_slot
from exirc.ir.state import STATE_MEMORY_ID, StateSlot
from exirc.plan.ops import alias_view, is_alloc, is_out_form, node_list
from exirc.plan.write_back_state import MUTATION_KINDS
from exirc.serialize import program as P

if TYPE_CHECKING:
    from torch.export import ExportedProgram

def operator_name(target: Any) -> tuple[str, str]:
    """(name, overload) of a kernel, e.g. ("aten::add", "out")."""
    if isinstance(target, torch._ops.OpOverload):
        # ExecuTorch names a default overload by its bare name (`aten::copy_`).
        overload = target._overloadname
        return target._schema.name, "" if overload == "default" else overload
    name = getattr(target, "kernel_name", None)  # backend ops carry their own
    if isinstance(name, tuple):
        return name
    raise InternalError(f"no kernel name for call target {target!r}")


def schema_of(target: Any) -> torch._C.FunctionSchema:
    schema = getattr(target, "_schema", None)
    if schema is None:
        raise InternalError(f"call target {target!r} has no schema")
    return schema


class MethodEmitter:
    def __init__(self, name: str, program: ExportedProgram, constants: ConstantTable) -> None:
        self.name = name
        self.program = program
        self.constants = constants
        self.table = ValueTable()
        self.operators: list[P.Operator] = []
        self._operator_index: dict[tuple[str, str], int] = {}
        self.instructions: list[P.Instruction] = []
        self.frames: list[P.FrameList] = []
        self.inputs: list[int] = []
        self.input_names: list[str] = []  # the placeholders' names: forward's parameters
        self.outputs: list[int] = []
        # The graph node each instruction comes from (for --verify and reports).
        self.instruction_nodes: list[Node] = []
        # Frames of the enclosing control-flow nodes: a subgraph's own nodes
        # carry traced frames (<eval_with_key>), not the user's.
        self._enclosing_frames: list[list[P.Frame]] = []
        self._false_value: int | None = None
        self.state_bytes = 0  # the end of the last state slot this method uses
        # Delegates in the order of ExecutionPlan.delegates (emit.delegates).
        self.lowered: list[LoweredDelegate] = []

    def emit(self) -> P.ExecutionPlan:
        _check_no_mutation_outputs(self.program)
        specs = {s.arg.name: s for s in self.program.graph_signature.input_specs
                 if isinstance(s.arg, TensorArgument)}
        for node in self.program.graph_module.graph.nodes:
            if node.op == "placeholder":
                self.placeholder(node, specs.get(node.name))
            elif node.op == "output":
                self.output(node)
            else:
                self.body_node(node)
        plan = memory_plan(self.program.graph_module)
        arena = 0 if plan is None else plan.arena_bytes
        return P.ExecutionPlan(
            name=self.name,
            values=self.table.values,
            inputs=self.inputs,
            outputs=self.outputs,
            chains=[P.Chain(inputs=[], outputs=[], instructions=self.instructions,
                            stacktrace=self.frames if any(f.items for f in self.frames)
                            else [])],
            operators=self.operators,
            non_const_buffer_sizes=[0, arena],
            container_meta_type=self.container_metadata(),
            delegates=[backend_delegate(lowered) for lowered in self.lowered],
        )

    # -- nodes -------------------------------------------------------------

    def body_node(self, node: Node) -> None:
        """A node other than placeholder and output, in any graph."""
        if node.op == "call_function":
            self.call(node)
        elif node.op != "get_attr":  # a get_attr is read by the control flow using it
            raise InternalError(f"cannot emit node {node.name} ({node.op})")

    def subgraph(self, module: GraphModule, operands: list[int], node: Node) -> list[int]:
        """Emit `module` inline with its placeholders bound to the values
        `operands`; the value indices of its results. `node` is the
        control-flow node calling it."""
        frames = self._frames(node)
        self._enclosing_frames.append(frames)
        try:
            for placeholder, operand in zip(placeholders(module), operands):
                self.table.of_node[placeholder] = operand
            for inner in module.graph.nodes:
                if inner.op not in ("placeholder", "output"):
                    self.body_node(inner)
            return [self.table.argument(r, "Tensor") for r in output_values(module)]
        finally:
            self._enclosing_frames.pop()

    def operand(self, value: Any) -> int:
        return self.table.argument(value, "Tensor" if isinstance(value, Node) else "int")

    def false_value(self) -> int:
        """A Bool(False) value: the condition of an unconditional jump."""
        if self._false_value is None:
            self._false_value = self.table.add(P.Bool(False))
        return self._false_value

    def append(self, instruction: P.Instruction, node: Node) -> int:
        """Add an instruction made for `node`; its index."""
        self.instructions.append(instruction)
        self.instruction_nodes.append(node)
        self.frames.append(P.FrameList(self._frames(node)))
        return len(self.instructions) - 1

    def _frames(self, node: Node) -> list[P.Frame]:
        frames = program_frames(node.meta.get("stack_trace"))
        if not frames and self._enclosing_frames:
            return self._enclosing_frames[-1]
        return frames

    def operator(self, name: str, overload: str) -> int:
        key = (name, overload)
        op_index = self._operator_index.get(key)
        if op_index is None:
            op_index = len(self.operators)
            self.operators.append(P.Operator(*key))
            self._operator_index[key] = op_index
        return op_index

    def kernel(self, name: str, overload: str, args: list[int], node: Node) -> int:
        return self.append(P.KernelCall(self.operator(name, overload), args), node)

    def placeholder(self, node: Node, spec: Any) -> None:
        fake = node.meta["val"]
        slot = state_slot(node)
        if slot is not None and spec is not None:
            self.state(node, spec.target, slot)
            return
        if spec is not None and spec.kind in (InputKind.PARAMETER, InputKind.BUFFER,
                                              InputKind.CONSTANT_TENSOR):
            tensor = self._constant(spec.target)
            name = constant_name(node) or spec.target
            self.table.of_node[node] = self.table.tensor(
                fake, data_buffer_idx=self.constants.add(tensor, name))
            return
        if fake is None or (isinstance(fake, (bool, int, float, str)) and not node.users):
            # An input the example gave as None (a keyword input left out, say)
            # or as a constant (use_cache=False): export specialised the graph
            # on it, so it is not the program's input.
            self.table.of_node[node] = self.table.add(P.Null())
            return
        if not isinstance(fake, torch.Tensor):
            raise UnsupportedOperatorError(
                f"input {node.name} is a {type(fake).__name__}; methods take tensors only",
                hint="pass scalars as 0-d tensors")
        index = self.table.tensor(fake, allocation=self._allocation(node))
        self.table.of_node[node] = index
        self.inputs.append(index)
        self.input_names.append(node.name)

    def state(self, node: Node, target: str, slot: StateSlot) -> None:
        """Program state: planned in the state arena, with its initial value and name."""
        index = self.table.tensor(
            node.meta["val"],
            data_buffer_idx=self.constants.add_state(self._constant(target), slot.name,
                                                     self._layout(target)),
            allocation=P.AllocationDetails.at(STATE_MEMORY_ID, slot.offset))
        value = self.table.values[index]
        assert isinstance(value, P.Tensor)
        value.extra_tensor_info = P.ExtraTensorInfo(fully_qualified_name=slot.name)
        self.table.of_node[node] = index
        self.state_bytes = max(self.state_bytes, slot.offset + slot.nbytes)

    def _layout(self, target: str) -> str:
        """How the method lays a state out: as the model does, or as bound ops need."""
        report = attention_report(self.program.graph_module)
        return "[B, S, H, D] for llama ops" if report is not None and \
            target in report.relaid else "the model's"

    def _constant(self, target: str) -> torch.Tensor:
        if target in self.program.constants:
            value = self.program.constants[target]
        else:
            value = self.program.state_dict[target]
        if not isinstance(value, torch.Tensor):
            raise InternalError(f"constant {target} is not a tensor")
        return value

    def _allocation(self, node: Node) -> P.AllocationDetails | None:
        memory = planned_memory(node)
        if memory is None:
            return None
        memory_id, offset = memory
        return P.AllocationDetails.at(memory_id, offset)

    def call(self, node: Node) -> None:
        target = node.target
        if is_alloc(node):
            self.table.of_node[node] = self.table.tensor(node.meta["val"],
                                                         allocation=self._allocation(node))
            return
        if target is operator.getitem:
            source, item = node.args
            assert isinstance(source, Node) and isinstance(item, int)
            self.table.of_node[node] = self.table.node_value(source)[item]
            return
        if is_out_form(node):
            emit_control_flow(self, node)
            return
        if target is alias_view:
            self.alias(node)
            return
        if isinstance(target, DelegateWithOuts):
            self.delegate_call(node, target.delegate)
            return
        self.kernel_call(node)

    def delegate_call(self, node: Node, lowered: LoweredDelegate) -> None:
        """A DelegateCall: its args are the inputs then the outputs it writes."""
        if lowered not in self.lowered:
            self.lowered.append(lowered)
        inputs = node_list(node.args[0])
        outs = [self.table.node_value(out) for out in node_list(node.kwargs["out"])]
        args = [self.table.argument(value, "Tensor") for value in inputs] + outs
        self.table.of_node[node] = outs
        self.append(P.DelegateCall(self.lowered.index(lowered), args), node)

    def alias(self, node: Node) -> None:
        """A view with no instruction: a tensor value over its input's memory."""
        base = self.table.values[self.table.argument(node.args[0], "Tensor")]
        if not isinstance(base, P.Tensor) or base.allocation_info is None:
            raise InternalError(f"view {node.name} aliases a tensor without planned memory")
        self.table.of_node[node] = self.table.tensor(node.meta["val"],
                                                     allocation=base.allocation_info)

    def kernel_call(self, node: Node) -> None:
        schema = schema_of(node.target)
        # A functional call into planned memory (plan/functional_ops.py) passes
        # its outs as result slots only: the kernel it calls has no outs.
        into_results = getattr(node.target, "outs_are_results", False)
        args = []
        for position, argument in enumerate(schema.arguments):
            if into_results and argument.is_out:
                continue
            if argument.kwarg_only or position >= len(node.args):
                if argument.name in node.kwargs:
                    value = node.kwargs[argument.name]
                elif argument.has_default_value():
                    value = argument.default_value
                else:
                    raise InternalError(f"{node.name}: missing argument {argument.name}")
            else:
                value = node.args[position]
            args.append(self.table.argument(value, str(argument.type)))
        results = self._results(node, schema)
        args.extend(results)
        self.kernel(*operator_name(node.target), args, node)

    def _results(self, node: Node, schema: torch._C.FunctionSchema) -> list[int]:
        """Value indices of the returns; the node's value becomes them."""
        outs = [a for a in schema.arguments if a.is_out]
        if outs:
            out_values: list[Any] = [node.kwargs[a.name] for a in outs]
            if len(outs) == 1 and isinstance(out_values[0], (list, tuple)):
                items = [self.table.node_value(n) for n in out_values[0]]
            else:
                items = [self.table.node_value(n) for n in out_values]
            if len(items) == 1 and not isinstance(out_values[0], (list, tuple)):
                self.table.of_node[node] = items[0]
                return items
            # Several outputs (or a Tensor[] out) return one TensorList of them,
            # as the runtime's kernel wrappers expect; getitem reads its items.
            self.table.of_node[node] = items
            return [self.table.add(P.TensorList(items))]
        written = _written_in_place(node, schema)
        if written is not None:
            # An in-place op (`copy_`) returns the tensor it writes into.
            index = self.table.argument(written, "Tensor")
            self.table.of_node[node] = index
            return [index]
        # No outs: the op returns a scalar (a size, a comparison) into a fresh
        # value that the instruction overwrites at run time.
        index = self.table.add(_scalar_result(schema, node.meta.get("val")))
        self.table.of_node[node] = index
        return [index]

    def output(self, node: Node) -> None:
        (results,) = node.args
        assert isinstance(results, (list, tuple))
        for result in results:
            self.outputs.append(self.table.argument(result, "Tensor"))

    def container_metadata(self) -> P.ContainerMetadata:
        from torch.utils._pytree import treespec_dumps

        spec = self.program.call_spec
        return P.ContainerMetadata(
            encoded_inp_str=treespec_dumps(spec.in_spec) if spec.in_spec else "",
            encoded_out_str=treespec_dumps(spec.out_spec) if spec.out_spec else "",
        )


def _written_in_place(node: Node, schema: torch._C.FunctionSchema) -> Node | None:
    """The argument an in-place op writes and returns (`self` of `copy_`), if any."""
    for position, argument in enumerate(schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write \
                and position < len(node.args) and isinstance(node.args[position], Node):
            return node.args[position]  # type: ignore[return-value]
    return None


def _check_no_mutation_outputs(program: ExportedProgram) -> None:
    """A method returns what the model returns: updates of buffers are state."""
    left = [str(spec.target) for spec in program.graph_signature.output_specs
            if spec.kind in MUTATION_KINDS]
    if left:
        raise UsageError(f"the pipeline leaves updates of {', '.join(left)} as outputs of "
                         "the method, so the program would not keep them",
                         hint="add the `write_back_state` pass to the plan stage, before "
                              "to_out_variants (see `exirc compile --print-pipeline`)")


def _scalar_result(schema: torch._C.FunctionSchema, value: Any) -> P.EValue:
    """An initial value for a scalar result: its example value from tracing."""
    returns = str(schema.returns[0].type) if schema.returns else "int"
    node = getattr(value, "node", None)
    hint = getattr(node, "hint", None) if node is not None else value
    if returns == "bool":
        return P.Bool(bool(hint))
    if returns == "float":
        return P.Double(float(hint or 0.0))
    return P.Int(int(hint or 0))
