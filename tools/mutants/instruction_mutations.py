"""Mutations of what a method does: its operators, arguments, and control flow.

Operator swaps use real operators (`catalog`), so they get past name checks
and test what a runtime does with a kernel given arguments meant for another.
Jump mutations make loops that never end and jumps out of range.
"""

from __future__ import annotations

from exirc.serialize import program as P
from tools.mutants import picks
from tools.mutants.catalog import Op
from tools.mutants.context import Context, model_kind


def _used_operator(ctx: Context) -> tuple[P.ExecutionPlan, int] | None:
    plan = picks.plan(ctx.program, ctx.rng)
    calls = picks.kernel_calls(plan) if plan else []
    used = sorted({call.op_index for call in calls
                   if plan and 0 <= call.op_index < len(plan.operators)})
    if plan is None or not used:
        return None
    return plan, ctx.rng.choice(used)


def _swap(ctx: Context, pool: list[Op]) -> str | None:
    found = _used_operator(ctx)
    if found is None or not pool:
        return None
    plan, index = found
    op = plan.operators[index]
    old = op.qualified_name
    arity = {o.arity for o in ctx.catalog.aten if o.name == op.name and o.overload == op.overload}
    same = [o for o in pool if o.arity in arity] if arity else []
    new = ctx.rng.choice(same if same and ctx.rng.random() < 0.7 else pool)
    op.name, op.overload = new.name, new.overload
    return f"{plan.name} operators[{index}] {old} -> {op.qualified_name}"


@model_kind("op_swap")
def op_swap(ctx: Context) -> str | None:
    """An operator becomes another the runtime has a kernel for."""
    return _swap(ctx, ctx.catalog.allowed)


@model_kind("op_swap_aten")
def op_swap_aten(ctx: Context) -> str | None:
    """An operator becomes any ATen operator torch has (most are not allowed)."""
    return _swap(ctx, ctx.catalog.aten)


@model_kind("op_overload")
def op_overload(ctx: Context) -> str | None:
    """Same operator, another overload (functional, out, Scalar, Tensor...)."""
    found = _used_operator(ctx)
    if found is None:
        return None
    plan, index = found
    op = plan.operators[index]
    old = op.qualified_name
    choices = [o for o in ctx.catalog.overloads.get(op.name, []) if o != op.overload]
    choices += ["", "out", "Tensor", "Scalar_out", "default", "__dict__", "out.out"]
    op.overload = ctx.rng.choice(choices)
    return f"{plan.name} operators[{index}] {old} -> {op.qualified_name}"


@model_kind("op_index")
def op_index(ctx: Context) -> str | None:
    plan = picks.plan(ctx.program, ctx.rng)
    call = picks.choice(ctx.rng, picks.kernel_calls(plan)) if plan else None
    if plan is None or call is None:
        return None
    old = call.op_index
    count = len(plan.operators)
    call.op_index = ctx.rng.choice([0, count - 1, count, -1] + list(range(count)))
    return f"{plan.name} KernelCall op_index {old} -> {call.op_index}"


@model_kind("arg_swap")
def arg_swap(ctx: Context) -> str | None:
    """Two arguments of one call trade places (an out with an input, a dim with a size)."""
    plan = picks.plan(ctx.program, ctx.rng)
    calls = [c for c in picks.kernel_calls(plan) if len(c.args) > 1] if plan else []
    call = picks.choice(ctx.rng, calls)
    if plan is None or call is None:
        return None
    call.args = list(call.args)  # its own: the reader shares equal short lists
    i, j = ctx.rng.sample(range(len(call.args)), 2)
    call.args[i], call.args[j] = call.args[j], call.args[i]
    return f"{plan.name} {_op(plan, call)} args {i} <-> {j}"


@model_kind("arg_replace")
def arg_replace(ctx: Context) -> str | None:
    """One argument becomes another value: often another call argument (an out
    that is also an input), sometimes a value of another kind."""
    plan = picks.plan(ctx.program, ctx.rng)
    call = picks.choice(ctx.rng, [c for c in picks.kernel_calls(plan) if c.args]) \
        if plan else None
    if plan is None or call is None:
        return None
    call.args = list(call.args)  # its own: the reader shares equal short lists
    position = ctx.rng.randrange(len(call.args))
    old = call.args[position]
    if ctx.rng.random() < 0.5:
        call.args[position] = ctx.rng.choice(call.args)
    else:
        call.args[position] = picks.any_value(plan, ctx.rng)
    return f"{plan.name} {_op(plan, call)} arg {position}: %{old} -> %{call.args[position]}"


@model_kind("args_length")
def args_length(ctx: Context) -> str | None:
    plan = picks.plan(ctx.program, ctx.rng)
    call = picks.choice(ctx.rng, picks.kernel_calls(plan)) if plan else None
    if plan is None or call is None:
        return None
    old = len(call.args)
    call.args = list(call.args)  # its own: the reader shares equal short lists
    if call.args and ctx.rng.random() < 0.5:
        del call.args[ctx.rng.randrange(len(call.args)):]
    else:
        call.args.extend(picks.any_value(plan, ctx.rng) for _ in range(ctx.rng.choice([1, 2, 50])))
    return f"{plan.name} {_op(plan, call)} args length {old} -> {len(call.args)}"


@model_kind("jump")
def jump(ctx: Context) -> str | None:
    """A jump goes elsewhere (back to make a loop, past the end) or tests another value."""
    plan = picks.plan(ctx.program, ctx.rng)
    found = picks.choice(ctx.rng, picks.instructions(plan, P.JumpFalseCall)) if plan else None
    if plan is None or found is None:
        return _insert_jump(ctx)
    chain, position = found
    instr = chain.instructions[position]
    assert isinstance(instr, P.JumpFalseCall)
    end = len(chain.instructions)
    if ctx.rng.random() < 0.7:
        old = instr.destination_instruction
        instr.destination_instruction = ctx.rng.choice(
            [0, position, max(position - 1, 0), end, end + 1, -1, 2**31 - 1,
             ctx.rng.randrange(end)])
        return f"{plan.name} jump at {position}: to {old} -> {instr.destination_instruction}"
    old = instr.cond_value_index
    instr.cond_value_index = picks.any_value(plan, ctx.rng)
    return f"{plan.name} jump at {position}: cond %{old} -> %{instr.cond_value_index}"


def _insert_jump(ctx: Context) -> str | None:
    """A backward jump on a value that stays false: a loop that never ends."""
    plan = picks.plan(ctx.program, ctx.rng)
    chain = picks.choice(ctx.rng, plan.chains) if plan else None
    if plan is None or chain is None or not chain.instructions:
        return None
    plan.values.append(P.Bool(False))
    position = ctx.rng.randrange(len(chain.instructions) + 1)
    target = ctx.rng.randrange(position + 1)
    chain.instructions.insert(position, P.JumpFalseCall(len(plan.values) - 1, target))
    if chain.stacktrace:
        chain.stacktrace.insert(position, P.FrameList())
    return f"{plan.name} inserted at {position}: jump back to {target} on a false Bool"


@model_kind("instructions")
def instructions(ctx: Context) -> str | None:
    """An instruction is duplicated, dropped, or swapped with another."""
    plan = picks.plan(ctx.program, ctx.rng)
    chain = picks.choice(ctx.rng, [c for c in plan.chains if c.instructions]) if plan else None
    if plan is None or chain is None:
        return None
    items = chain.instructions
    i = ctx.rng.randrange(len(items))
    action = ctx.rng.choice(["duplicate", "drop", "swap"])
    if action == "duplicate":
        items.insert(ctx.rng.randrange(len(items) + 1), items[i])
    elif action == "drop":
        items.pop(i)
    else:
        j = ctx.rng.randrange(len(items))
        items[i], items[j] = items[j], items[i]
    if chain.stacktrace and ctx.rng.random() < 0.8:  # kept parallel, as a writer would
        chain.stacktrace = (chain.stacktrace + [P.FrameList()] * len(items))[:len(items)]
    return f"{plan.name} instruction {i}: {action} ({len(items)} now)"


@model_kind("move_free")
def move_free(ctx: Context) -> str | None:
    """A MoveCall or FreeCall between arbitrary values, inserted anywhere."""
    plan = picks.plan(ctx.program, ctx.rng)
    chain = picks.choice(ctx.rng, plan.chains) if plan else None
    if plan is None or chain is None:
        return None
    position = ctx.rng.randrange(len(chain.instructions) + 1)
    instr: P.Instruction
    if ctx.rng.random() < 0.6:
        instr = P.MoveCall(picks.any_value(plan, ctx.rng), picks.any_value(plan, ctx.rng))
    else:
        instr = P.FreeCall(picks.any_value(plan, ctx.rng))
    chain.instructions.insert(position, instr)
    if chain.stacktrace:
        chain.stacktrace.insert(position, P.FrameList())
    return f"{plan.name} inserted at {position}: {instr}"


@model_kind("delegate_call")
def delegate_call(ctx: Context) -> str | None:
    plan = picks.plan(ctx.program, ctx.rng)
    found = picks.choice(ctx.rng, picks.instructions(plan, P.DelegateCall)) if plan else None
    if plan is None or found is None:
        return None
    chain, position = found
    instr = chain.instructions[position]
    assert isinstance(instr, P.DelegateCall)
    action = ctx.rng.choice(["index", "arg", "drop_arg", "add_arg"])
    instr.args = list(instr.args)  # its own: the reader shares equal short lists
    if action == "index":
        instr.delegate_index = ctx.rng.choice([-1, len(plan.delegates), 0, 2**31 - 1])
    elif action == "arg" and instr.args:
        instr.args[ctx.rng.randrange(len(instr.args))] = picks.any_value(plan, ctx.rng)
    elif action == "drop_arg" and instr.args:
        instr.args.pop(ctx.rng.randrange(len(instr.args)))
    else:
        instr.args.append(picks.any_value(plan, ctx.rng))
    return f"{plan.name} DelegateCall at {position}: {action} -> {instr}"


def _op(plan: P.ExecutionPlan, call: P.KernelCall) -> str:
    if 0 <= call.op_index < len(plan.operators):
        return plan.operators[call.op_index].qualified_name
    return f"operator {call.op_index}"
