"""A method's value table: one Python object per program value.

The value table (`env`) holds one Python object per program value: a torch
tensor over planned, constant or run-time memory; an int, float or bool; a
string; a list. Tensors are created once, before the method first runs, and
changed only in place, so the prepared instructions can hold them directly.
Ints, floats and bools that instructions write at run time (sizes computed by
prim ops, loop counters, conditions) are `written`: they are read from the
table when used.

A torch tensor costs ~2 KiB, so loading does not keep them: it builds the
table with `keep_tensors=False`, which makes each tensor (so that whatever
would refuse it refuses it at load) and puts the one `UNMADE` placeholder in
its slot. That skeleton is what the load-time checks and the trial
preparation of instructions read (`exirc.runtime.core.method`); the method's
first run builds the real table with the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from exirc.errors import ExternalDataError
from exirc.runtime.core import arenas as memory
from exirc.runtime.kernels.registry import Kernel
from exirc.serialize import program as P


@dataclass
class Values:
    """A method's values, as preparing its instructions needs to know them."""

    env: list[Any]  # the value table the run loop reads and writes
    evalues: list[P.EValue]  # the program's values, for kinds and metadata
    written: frozenset[int]  # values other than tensors that change at run time


UNMADE = torch.zeros(0)
"""What a skeleton table (`keep_tensors=False`) holds for every tensor: a real
tensor, so that preparing an instruction against it does what it does against
the real table, but never run."""


def value_table(program: P.Program, plan: P.ExecutionPlan,
                arenas: memory.Arenas, where: str,
                initial_state: list[tuple[Any, memoryview]],
                keep_tensors: bool = True,
                external: Mapping[str, bytes | memoryview] | None = None) -> list[Any]:
    """The table of `plan`'s values; each tensor that is program state adds
    (where in an arena, initial bytes) to `initial_state`. `keep_tensors=False`:
    each tensor is made and dropped, and `UNMADE` stands in its slot. `external`:
    the bytes of the tensors kept in a data file, by name, checked at load
    (`exirc.runtime.core.external_data`)."""
    env: list[Any] = []
    copies = _Copies()
    for i, value in enumerate(plan.values):
        if isinstance(value, P.Tensor):
            made = _tensor(program, value, arenas, where, i, initial_state, external or {})
            env.append(made if keep_tensors else UNMADE)
        elif isinstance(value, P.Int):
            env.append(value.int_val)
        elif isinstance(value, P.Double):
            env.append(value.double_val)
        elif isinstance(value, P.Bool):
            env.append(value.bool_val)
        elif isinstance(value, P.String):
            env.append(value.string_val)
        elif isinstance(value, (P.DoubleList, P.BoolList)):
            env.append(copies.of(value.items, lambda items: list(items)))
        else:
            env.append(None)  # Null, and the lists of other values filled below
    for i, value in enumerate(plan.values):
        if isinstance(value, (P.IntList, P.TensorList)):
            env[i] = copies.of(value.items, lambda items: [env[item] for item in items])
        elif isinstance(value, P.OptionalTensorList):
            env[i] = copies.of(value.items,
                               lambda items: [None if item == -1 else env[item] for item in items])
    return env


class _Copies:
    """The table's list for each long list of the program, made once.

    A file may point many values at one list table (the reader then shares
    one list object); copying it per value would cost values x items.
    """

    SHORT = 16  # shorter lists are copied per value: cheaper than remembering them

    def __init__(self) -> None:
        self.made: dict[int, list[Any]] = {}

    def of(self, items: list[Any], copy: Callable[[list[Any]], list[Any]]) -> list[Any]:
        if len(items) <= self.SHORT:
            return copy(items)
        made = self.made.get(id(items))
        if made is None:
            made = self.made[id(items)] = copy(items)
        return made


def _tensor(program: P.Program, meta: P.Tensor, arenas: memory.Arenas, where: str, index: int,
            initial_state: list[tuple[Any, memoryview]],
            external: Mapping[str, bytes | memoryview]) -> torch.Tensor:
    at = f"{where}.values[{index}]"
    dtype = memory.torch_dtype(meta.scalar_type, at)
    extra = meta.extra_tensor_info
    if extra is not None and extra.location == P.TensorDataLocation.EXTERNAL:
        data = external.get(extra.fully_qualified_name or "")
        if data is None:  # loading resolves every external tensor first
            raise ExternalDataError(f"{at} reads {extra.fully_qualified_name!r} from an "
                                    "external data file, which was not resolved")
        return memory.constant_tensor(data, meta, dtype)
    info = meta.allocation_info
    if info is None:
        if meta.data_buffer_idx:
            return memory.constant_tensor(program.constant_data(meta.data_buffer_idx), meta, dtype)
        return memory.placeholder(dtype)  # memory arrives at run time (input, view)
    arena = arenas[info.memory_id]
    if meta.data_buffer_idx:  # mutable state with an initial value, set by reset_state
        start = info.offset
        initial_state.append((arena[start:start + meta.nbytes],
                              memory.initial_state(program, meta, at)))
    return memory.planned_tensor(arena, meta, dtype)


def written_values(plan: P.ExecutionPlan, kernels: Mapping[int, Kernel]) -> frozenset[int]:
    """Values other than tensors that change at run time: they are read when used.

    Inputs, the result slots of kernels, and the targets of moves. (Tensors
    change only in place, so the objects bound at load stay right.)
    """
    values = plan.values
    tensors = (P.Tensor, P.TensorList, P.OptionalTensorList)
    # Tensors are left out as they are met: most results are tensors, and a set
    # of them all would cost a method of many calls more than its file.
    written = {i for i in plan.inputs if not isinstance(values[i], tensors)}
    for chain in plan.chains:
        for instr in chain.instructions:
            if isinstance(instr, P.KernelCall):
                for i in instr.args[len(kernels[instr.op_index].schema.arguments):]:
                    if not isinstance(values[i], tensors):
                        written.add(i)
            elif isinstance(instr, P.MoveCall) and not isinstance(values[instr.move_to], tensors):
                written.add(instr.move_to)
    return frozenset(written)


def copied_out(value: Any) -> Any:
    """An output as the caller keeps it: a tensor (in lists too) copied out of the
    planned memory the next run overwrites."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    return [copied_out(item) for item in value] if isinstance(value, list) else value
