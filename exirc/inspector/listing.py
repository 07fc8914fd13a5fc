"""Instructions as readable SSA text, one a line.

In the spirit of the TorchScript IR's canonical text: every value is `%N`
(its index in the plan's value table), a kernel call reads
`%7 : f32[4, 128] = aten::addmm.out(%3, %0, %5, 1, 1, out=%7)`, and
non-tensor arguments are shown as literals so the line stands on its own,
except numbers that instructions write at run time (sizes, loop counters),
which are `%N` too. Control flow reads like code: a `JumpFalseCall` is
`if not %8: goto 8` (or `goto 10` when its condition is a constant False),
and the branches and loop bodies it delimits are indented:

       2  if not %8: goto 8
       3    %11 : f32[4, 3] = aten::relu.out(%3, out=%11)
       4    goto 6
          else:
       5    %12 : f32[4, 3] = aten::neg.out(%3, out=%12)
       6  %13 : ...
          loop:
       7    ...
       9    if not %16: goto 7
"""

from __future__ import annotations

from array import array
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exirc.inspector.delegates import Payload, call_note
from exirc.serialize import program as P
from exirc.serialize.symbolic_shapes import MethodShapes

# Long literal lists are cut so a line stays readable.
_MAX_LIST_ITEMS = 8
# Nesting indented at most this deep (a file can nest a hundred thousand loops).
_MAX_DEPTH = 32

# Kernels that return nothing: their last argument is an input, not a result.
NO_RESULT_OPS = frozenset({"executorch_prim::et_copy_index.tensor"})

# The type text of tensors by (dtype, dynamism, *sizes): a plan of a hundred
# thousand tensors has a few dozen types.
_TENSOR_TYPES: dict[tuple[object, ...], str] = {}
_TENSOR_TYPES_KEPT = 4096


def value_type(value: P.EValue, dims: list[str] | None = None) -> str:
    """The type of a value, e.g. `f32[2, 3]`, `f32[s0<=64, 3]`, `int`, `Tensor[]`.

    `dims` are a dynamic tensor's dims by symbol, when the file stores them;
    without them every dim of a dynamic tensor shows as an upper bound.
    """
    if isinstance(value, P.Tensor):
        if dims is not None and len(dims) == len(value.sizes):
            return f"{value.scalar_type.short_name}[{', '.join(dims)}]"
        key = (value.scalar_type, value.shape_dynamism, *value.sizes)
        text = _TENSOR_TYPES.get(key)
        if text is None:
            bound = "<=" if value.shape_dynamism != P.TensorShapeDynamism.STATIC else ""
            shown = ", ".join(f"{bound}{s}" for s in value.sizes)
            text = f"{value.scalar_type.short_name}[{shown}]"
            if len(_TENSOR_TYPES) < _TENSOR_TYPES_KEPT:
                _TENSOR_TYPES[key] = text
        return text
    return {
        P.Null: "None", P.Int: "int", P.Bool: "bool", P.Double: "float", P.String: "str",
        P.IntList: "int[]", P.DoubleList: "float[]", P.BoolList: "bool[]",
        P.TensorList: "Tensor[]", P.OptionalTensorList: "Tensor?[]",
    }[type(value)]


def _literal_list(items: list[Any], fmt: Any) -> str:
    shown = [fmt(x) for x in items[:_MAX_LIST_ITEMS]]
    if len(items) > _MAX_LIST_ITEMS:
        shown.append(f"... {len(items) - _MAX_LIST_ITEMS} more")
    return "[" + ", ".join(shown) + "]"


def written_scalars(plan: P.ExecutionPlan) -> frozenset[int]:
    """Non-tensor values that instructions write (results of size and prim ops)."""
    written: set[int] = set()
    for chain in plan.chains:
        for instr in chain.instructions:
            if isinstance(instr, P.KernelCall) and instr.args and \
                    _op_name(plan, instr) not in NO_RESULT_OPS:
                written.add(instr.args[-1])
            elif isinstance(instr, P.MoveCall):
                written.add(instr.move_to)
    return frozenset(i for i in written if 0 <= i < len(plan.values)
                     and isinstance(plan.values[i], (P.Int, P.Bool, P.Double)))


def _op_name(plan: P.ExecutionPlan, instr: P.KernelCall) -> str:
    if 0 <= instr.op_index < len(plan.operators):
        return plan.operators[instr.op_index].qualified_name
    return "?"


def operand(plan: P.ExecutionPlan, index: int, written: Collection[int] = ()) -> str:
    """An argument as written in a call: `%N` for tensors and run-time numbers,
    a literal otherwise."""
    value = plan.values[index]
    if isinstance(value, P.Tensor) or index in written:
        return f"%{index}"
    if isinstance(value, P.Null):
        return "None"
    if isinstance(value, P.Int):
        return str(value.int_val)
    if isinstance(value, P.Bool):
        return "True" if value.bool_val else "False"
    if isinstance(value, P.Double):
        return repr(value.double_val)
    if isinstance(value, P.String):
        return repr(value.string_val)
    if isinstance(value, P.IntList):
        # Items are value indices: show constants as ints, SymInts as %N.
        return _literal_list(value.items, lambda i: _boxed_int(plan, i))
    if isinstance(value, (P.DoubleList, P.BoolList)):
        return _literal_list(value.items, repr)
    if isinstance(value, P.TensorList):
        return _literal_list(value.items, lambda i: f"%{i}")
    return _literal_list(value.items, lambda i: "None" if i == -1 else f"%{i}")


def _boxed_int(plan: P.ExecutionPlan, index: int) -> str:
    value = plan.values[index]
    return str(value.int_val) if isinstance(value, P.Int) else f"%{index}"


def instruction_text(plan: P.ExecutionPlan, instr: P.Instruction,
                     context: ListingContext | None = None) -> str:
    """One instruction as text; `context` adds run-time numbers and symbols."""
    written = context.written if context is not None else frozenset()
    if isinstance(instr, P.KernelCall):
        op = _op_name(plan, instr)
        if not instr.args:
            return f"{op}()"
        if op in NO_RESULT_OPS:
            return f"{op}({', '.join(operand(plan, i, written) for i in instr.args)})"
        # Args are the schema's arguments, then the return value; for an
        # out-variant the return is the `out` argument again.
        *ins, ret = instr.args
        args = [operand(plan, i, written) for i in ins]
        if ins and ins[-1] == ret and not op.startswith("executorch_prim::"):
            args[-1] = f"out={args[-1]}"  # prim ops may read their result (`i = i - i`)
        dims = context.dims(ret) if context is not None else None
        result = f"%{ret} : {value_type(plan.values[ret], dims)}"
        return f"{result} = {op}({', '.join(args)})"
    if isinstance(instr, P.DelegateCall):
        name = plan.delegates[instr.delegate_index].id
        operands = ", ".join(f"%{i}" for i in instr.args)
        text = f"delegate[{instr.delegate_index}] {name}({operands})"
        note = context.delegate_notes.get(instr.delegate_index) if context is not None else None
        return f"{text} {{{note}}}" if note else text
    if isinstance(instr, P.MoveCall):
        return f"%{instr.move_to} = move %{instr.move_from}"
    if isinstance(instr, P.JumpFalseCall):
        if context is not None:
            if _always_jumps(plan, instr, written):
                return f"goto {instr.destination_instruction}"
            return f"if not %{instr.cond_value_index}: goto {instr.destination_instruction}"
        return f"jump_false %{instr.cond_value_index} -> {instr.destination_instruction}"
    return f"free %{instr.value_index}"


def _always_jumps(plan: P.ExecutionPlan, instr: P.JumpFalseCall, written: Collection[int]) -> bool:
    index = instr.cond_value_index
    value = plan.values[index] if 0 <= index < len(plan.values) else None
    return isinstance(value, P.Bool) and not value.bool_val and index not in written


@dataclass
class ListingContext:
    """What reading one plan's instructions needs beyond one instruction."""

    written: frozenset[int] = frozenset()
    shapes: MethodShapes | None = None
    # Delegate index -> what its call line says about the payload (node count).
    delegate_notes: dict[int, str] = field(default_factory=dict)

    @classmethod
    def of(cls, plan: P.ExecutionPlan, shapes: MethodShapes | None = None,
           payloads: Sequence[Payload] = ()) -> ListingContext:
        """`payloads`: the plan's delegates' (`delegates.plan_payloads`), if read."""
        notes = {p.index: note for p in payloads if (note := call_note(p)) is not None}
        return cls(written_scalars(plan), shapes, notes)

    def dims(self, value: int) -> list[str] | None:
        return self.shapes.describe_dims(value) if self.shapes is not None else None


@dataclass
class _Layout:
    """Indentation depth of each instruction and the pseudo-lines before it."""

    depth: array[int]
    before: dict[int, list[str]] = field(default_factory=dict)


def control_flow_layout(plan: P.ExecutionPlan, chain: P.Chain,
                        context: ListingContext) -> _Layout:
    """Indent branches and loop bodies, from the jumps alone.

    A backward jump closes a loop that starts at its destination; a forward
    conditional jump opens a `then` range up to its destination, and if the
    `then` range ends with an unconditional forward jump, what lies between
    is the `else` range. A conditional jump to just past a loop's backward
    jump is the loop's exit, not a branch.

    Each range adds one level to its instructions: ranges are summed as
    differences and added up once, so the work is linear however many jumps
    span however many instructions.
    """
    instructions = chain.instructions
    count = len(instructions)
    change = array("q", [0]) * (count + 1)
    before: dict[int, list[str]] = {}

    def indent(start: int, stop: int) -> None:  # [start, stop)
        start, stop = max(start, 0), min(stop, count)
        if start < stop:
            change[start] += 1
            change[stop] -= 1

    def jump(k: int) -> P.JumpFalseCall | None:
        instr = instructions[k] if 0 <= k < count else None
        return instr if isinstance(instr, P.JumpFalseCall) else None

    for i, instr in enumerate(instructions):
        if not isinstance(instr, P.JumpFalseCall):
            continue
        target = instr.destination_instruction
        if target <= i:
            indent(target, i + 1)
            before.setdefault(target, []).append("loop:")
            continue
        if _always_jumps(plan, instr, context.written):
            continue  # the end of a `then` range, or a loop's exit: seen from there
        closing = jump(target - 1)
        if closing is not None and closing.destination_instruction <= target - 1:
            continue  # exits the loop that ends just before `target`
        indent(i + 1, target)
        if closing is not None and _always_jumps(plan, closing, context.written) and \
                closing.destination_instruction > target:
            indent(target, closing.destination_instruction)
            before.setdefault(target, []).append("else:")
    depth = array("q", [0]) * count
    level = 0
    for k in range(count):
        level += change[k]
        depth[k] = level
    return _Layout(depth, before)


def source_of(frames: list[P.Frame]) -> dict[str, Any] | None:
    """The innermost frame of an instruction's stack trace, if any."""
    if not frames:
        return None
    frame = frames[-1]
    return {"file": frame.filename, "line": frame.lineno, "function": frame.name,
            "code": frame.context}


def listing_lines(plan: P.ExecutionPlan, shapes: MethodShapes | None = None,
                  payloads: Sequence[Payload] = (),
                  notes: Mapping[tuple[int, int], str] | None = None,
                  modules: Sequence[Sequence[str]] | None = None) -> Iterator[str]:
    """`notes`: (chain, index) -> text shown after a call, in braces; `modules`:
    per chain, the submodule each instruction came from, shown after its source."""
    context = ListingContext.of(plan, shapes, payloads)
    width = len(str(max((len(c.instructions) for c in plan.chains), default=1)))
    for c, chain in enumerate(plan.chains):
        ins = _operand_list(chain.inputs)
        outs = _operand_list(chain.outputs)
        yield f"chain {c} ({ins}) -> ({outs}):"
        layout = control_flow_layout(plan, chain, context)
        for i, instr in enumerate(chain.instructions):
            pad = "  " * min(layout.depth[i], _MAX_DEPTH)
            for label in layout.before.get(i, []):
                yield f"  {'':>{width}}  {pad[:-2]}{label}"
            text = f"  {i:>{width}}  {pad}{instruction_text(plan, instr, context)}"
            if notes and (c, i) in notes:
                text += f" {{{notes[c, i]}}}"
            source = source_of(chain.stacktrace[i].items) if chain.stacktrace else None
            module = modules[c][i] if modules is not None else ""
            if source and source["file"]:
                text += f"    # {source['file']}:{source['line']}"
                if module:
                    text += f" [{module}]"
            elif module:
                text += f"    # [{module}]"
            yield text


def _operand_list(indices: list[int]) -> str:
    """`%0, %1`, cut after a screenful."""
    shown = ", ".join(f"%{i}" for i in indices[:_MAX_LIST_ITEMS])
    more = len(indices) - _MAX_LIST_ITEMS
    return f"{shown}, ... {more} more" if more > 0 else shown
