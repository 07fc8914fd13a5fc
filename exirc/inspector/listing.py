"""Instructions as readable SSA text, one a line.

In the spirit of the TorchScript IR's canonical text: every value is `%N`
(its index in the plan's value table), a kernel call reads
`%7 : f32[4, 128] = aten::addmm.out(%3, %0, %5, 1, 1, out=%7)`, and
non-tensor arguments are shown as literals so the line stands on its own.
"""

from __future__ import annotations

from typing import Any

from exirc import program as P

# Long literal lists are cut so a line stays readable.
_MAX_LIST_ITEMS = 8


def value_type(value: P.EValue) -> str:
    """The type of a value, e.g. `f32[2, 3]`, `int`, `Tensor[]`."""
    if isinstance(value, P.Tensor):
        # Sizes of a dynamic tensor are upper bounds; the file does not say
        # which dimensions vary, so every one is marked.
        bound = "<=" if value.shape_dynamism != P.TensorShapeDynamism.STATIC else ""
        dims = ", ".join(f"{bound}{s}" for s in value.sizes)
        return f"{value.scalar_type.short_name}[{dims}]"
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


def operand(plan: P.ExecutionPlan, index: int) -> str:
    """An argument as written in a call: `%N` for tensors, a literal otherwise."""
    value = plan.values[index]
    if isinstance(value, P.Tensor):
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
        return _literal_list(list(value.items), repr)
    if isinstance(value, P.TensorList):
        return _literal_list(value.items, lambda i: f"%{i}")
    return _literal_list(value.items, lambda i: "None" if i == -1 else f"%{i}")


def _boxed_int(plan: P.ExecutionPlan, index: int) -> str:
    value = plan.values[index]
    return str(value.int_val) if isinstance(value, P.Int) else f"%{index}"


def instruction_text(plan: P.ExecutionPlan, instr: P.Instruction) -> str:
    if isinstance(instr, P.KernelCall):
        op = plan.operators[instr.op_index].qualified_name
        if not instr.args:
            return f"{op}()"
        # Args are the schema's arguments, then the return value; for an
        # out-variant the return is the `out` argument again.
        *ins, ret = instr.args
        args = [operand(plan, i) for i in ins]
        if ins and ins[-1] == ret:
            args[-1] = f"out={args[-1]}"
        result = f"%{ret} : {value_type(plan.values[ret])}"
        return f"{result} = {op}({', '.join(args)})"
    if isinstance(instr, P.DelegateCall):
        name = plan.delegates[instr.delegate_index].id
        operands = ", ".join(f"%{i}" for i in instr.args)
        return f"delegate[{instr.delegate_index}] {name}({operands})"
    if isinstance(instr, P.MoveCall):
        return f"%{instr.move_to} = move %{instr.move_from}"
    if isinstance(instr, P.JumpFalseCall):
        return f"jump_false %{instr.cond_value_index} -> {instr.destination_instruction}"
    return f"free %{instr.value_index}"


def source_of(frames: list[P.Frame]) -> dict[str, Any] | None:
    """The innermost frame of an instruction's stack trace, if any."""
    if not frames:
        return None
    frame = frames[-1]
    return {"file": frame.filename, "line": frame.lineno, "function": frame.name,
            "code": frame.context}


def listing_lines(plan: P.ExecutionPlan) -> list[str]:
    lines = []
    width = len(str(max((len(c.instructions) for c in plan.chains), default=1)))
    for c, chain in enumerate(plan.chains):
        ins = ", ".join(f"%{i}" for i in chain.inputs)
        outs = ", ".join(f"%{i}" for i in chain.outputs)
        lines.append(f"chain {c} ({ins}) -> ({outs}):")
        for i, instr in enumerate(chain.instructions):
            text = f"  {i:>{width}}  {instruction_text(plan, instr)}"
            source = source_of(chain.stacktrace[i].items) if chain.stacktrace else None
            if source and source["file"]:
                text += f"    # {source['file']}:{source['line']}"
            lines.append(text)
    return lines
