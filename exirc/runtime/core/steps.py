"""Preparing instructions: each becomes a step, a closure the run loop calls.

A step runs its instruction and returns the index of the next instruction
when it jumps (None otherwise). Everything an instruction needs is looked up
and checked here, at load, so the run loop does no lookups and no string work:

    KernelCall      call the bound kernel (`binding.bind`)
    DelegateCall    call the backend with its handle (`delegates.bind`)
    MoveCall        value move_to = value move_from; a tensor's data is copied
                    into move_to's planned memory (or aliased, if it has none)
    JumpFalseCall   if the Bool value is false, jump to destination_instruction
    FreeCall        nothing: planned memory is never freed while loaded

Each step has a `Site` alongside it: where the instruction is and what it
runs, for messages and profiles, kept out of the step itself.

Beside its step, each instruction but a jump has an action: the same work,
for a chain with no jumps (`Method._execute_straight`), whose result is
ignored; for a plain KernelCall, a faster call than its step (`binding.Bound`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch

from exirc.errors import FormatError
from exirc.runtime.core import arenas as memory
from exirc.runtime.core.binding import bind
from exirc.runtime.core.values import Values
from exirc.runtime.delegates import registry as delegates
from exirc.runtime.kernels.registry import Kernel, copy_into, operator_key
from exirc.serialize import program as P

Step = Callable[[], "int | None"]
Action = Callable[[], Any]


class Prepared(NamedTuple):
    """An instruction made ready: its step, and its action (None for a jump)."""

    step: Step
    action: Action | None


@dataclass(frozen=True)
class Site:
    """Where an instruction is, for messages: its chain, index, what it runs, its source.

    `module` is the model's submodule the instruction came from, as
    `model.get_submodule` names it (`encoder.layers.1.linear`); empty when the
    program kept none.
    """

    chain: int
    index: int
    label: str
    source: str
    module: str = ""

    @property
    def origin(self) -> str:
        """What a message says of where the instruction came from, after what it
        did: ` (from model.py:12 in forward: code) [module encoder.fc]`, or ""."""
        text = f" (from {self.source})" if self.source else ""
        return f"{text} [module {self.module}]" if self.module else text


def site_of(plan: P.ExecutionPlan, chain: int, index: int) -> Site:
    """The site of instruction `index` of chain `chain`."""
    chain_ = plan.chains[chain]
    return Site(chain, index, _label(plan, chain_.instructions[index]), _source(chain_, index))


def with_module(site: Site, modules: Sequence[str], count: int) -> Site:
    """`site` with its instruction's module path from `modules` (its chain's: a
    path per instruction; unchanged unless there are `count`, the chain's length)."""
    if len(modules) != count:
        return site
    return replace(site, module=modules[site.index])


def prepare(instr: P.Instruction, kernels: Mapping[int, Kernel],
            backends: Sequence[tuple[Any, Any]], values: Values, where: str) -> Prepared:
    """The step and action that run `instr`; `where` names it in errors about the file."""
    if isinstance(instr, P.KernelCall):
        bound = bind(kernels[instr.op_index], instr.args, values, where)
        return Prepared(bound.call, bound.action or bound.call)
    if isinstance(instr, P.JumpFalseCall):
        step = _jump_false(values, instr.cond_value_index, instr.destination_instruction, where)
        return Prepared(step, None)
    if isinstance(instr, P.DelegateCall):
        backend, handle = backends[instr.delegate_index]
        step = delegates.bind(backend, handle, instr.args, values.env, values.written)
    elif isinstance(instr, P.MoveCall):
        step = _move(values, instr.move_from, instr.move_to, where)
    else:
        step = _free
    return Prepared(step, step)


def _move(values: Values, source: int, target: int, where: str) -> Step:
    env = values.env
    kind = values.evalues[target]
    if not isinstance(kind, P.Tensor):
        moved = values.evalues[source]
        if type(moved) is not type(kind) and not isinstance(kind, P.Null):
            # Kernels bound at load trust each slot's kind; an Int moved into an
            # IntList slot would reach them as the wrong Python type.
            raise FormatError(f"{where} moves value {source} ({type(moved).__name__}) into "
                              f"value {target} ({type(kind).__name__}), a different kind")

        def move_value() -> None:
            env[target] = env[source]
        return move_value
    if not isinstance(values.evalues[source], P.Tensor):
        raise FormatError(f"{where} moves a {type(values.evalues[source]).__name__} into a "
                          "tensor")
    if kind.data_buffer_idx and kind.allocation_info is None:
        raise FormatError(f"{where} moves into value {target}, a constant tensor")
    src: torch.Tensor = env[source]
    dst: torch.Tensor = env[target]
    if kind.allocation_info is None:
        def share() -> None:
            memory.alias(dst, src)
        return share

    def copy() -> None:
        copy_into(dst, src)
    return copy


def _jump_false(values: Values, condition: int, destination: int, where: str) -> Step:
    env = values.env
    kind = values.evalues[condition]
    if isinstance(kind, P.Tensor):
        tensor: torch.Tensor = env[condition]

        def jump_on_tensor() -> int | None:
            return None if bool(tensor) else destination
        return jump_on_tensor
    if not isinstance(kind, P.Bool):
        raise FormatError(f"{where}: its condition, value {condition}, is a "
                          f"{type(kind).__name__}, not a Bool")

    def jump() -> int | None:
        return None if env[condition] else destination
    return jump


def _free() -> None:
    return None


def _label(plan: P.ExecutionPlan, instr: P.Instruction) -> str:
    if isinstance(instr, P.KernelCall):
        op = plan.operators[instr.op_index]
        return operator_key(op.name, op.overload)
    if isinstance(instr, P.DelegateCall):
        return f"delegate {plan.delegates[instr.delegate_index].id}"
    names = {P.MoveCall: "move", P.JumpFalseCall: "jump_false", P.FreeCall: "free"}
    return names[type(instr)]


def _source(chain: P.Chain, index: int) -> str:
    """The innermost source frame of instruction `index`, if the program kept one."""
    if index >= len(chain.stacktrace) or not chain.stacktrace[index].items:
        return ""
    frame = chain.stacktrace[index].items[-1]
    text = f"{frame.filename or '?'}:{frame.lineno}"
    if frame.name:
        text += f" in {frame.name}"
    if frame.context:
        text += f": {frame.context.strip()}"
    return text
