"""When each value of a method holds data: lifetimes read off the instruction stream.

The chains of a method are numbered one after the other ("positions"): a
value is live from the first instruction that reads or writes it to the last
one; method inputs are live from position 0 and outputs to the end. A
backward JumpFalseCall is a loop: its body runs again, so a tensor used both
inside the loop and outside it is live through the whole loop.

Costs stay linear in the file: lifetimes are two arrays of positions, not an
object per value; a list used by many instructions passes its lifetime to
its items once, not once per use; and extending lifetimes over loops is
bounded work (past the bound, over crossing loops, it is approximated, and
says so).
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

from exirc.serialize import program as P

Lifetime = tuple[int, int]  # first and last position, inclusive

NONE = -1  # `first` of a value no instruction uses

# Loop extension checks (value, loop) pairs; honest programs have few loops
# and need far fewer checks than this per value, loop and instruction.
_WORK_PER_ENTRY = 64
_WORK_FLOOR = 1 << 20


def touched_values(plan: P.ExecutionPlan, instr: P.Instruction) -> Iterator[int]:
    """Value indices an instruction reads or writes, list items included."""
    yield from direct_operands(instr)
    if isinstance(instr, (P.KernelCall, P.DelegateCall)):
        for index in instr.args:
            value = plan.values[index]
            if isinstance(value, (P.TensorList, P.OptionalTensorList)):
                yield from (item for item in value.items if item >= 0)


def direct_operands(instr: P.Instruction) -> Iterator[int]:
    """Value indices an instruction names itself (not the items of its lists)."""
    if isinstance(instr, (P.KernelCall, P.DelegateCall)):
        yield from instr.args
    elif isinstance(instr, P.MoveCall):
        yield instr.move_from
        yield instr.move_to
    elif isinstance(instr, P.JumpFalseCall):
        yield instr.cond_value_index
    else:
        yield instr.value_index


def loop_ranges(plan: P.ExecutionPlan) -> list[Lifetime]:
    """(destination, jump) positions of every backward JumpFalseCall."""
    loops = []
    start = 0
    for chain in plan.chains:
        for i, instr in enumerate(chain.instructions):
            if isinstance(instr, P.JumpFalseCall) and instr.destination_instruction <= i:
                loops.append((start + instr.destination_instruction, start + i))
        start += len(chain.instructions)
    return loops


@dataclass
class Lifetimes:
    """First and last position of each value of a method (`first` is NONE for a
    value no instruction uses). `approximate`: loops crossed each other in too
    many ways to follow exactly, so lifetimes cover whole loop regions."""

    first: array[int]
    last: array[int]
    approximate: bool = False

    def get(self, index: int) -> Lifetime | None:
        first = self.first[index]
        return None if first == NONE else (first, self.last[index])

    def touch(self, index: int, first: int, last: int) -> None:
        old = self.first[index]
        if old == NONE:
            self.first[index], self.last[index] = first, last
            return
        if first < old:
            self.first[index] = first
        if last > self.last[index]:
            self.last[index] = last

    def as_dict(self) -> dict[int, Lifetime]:
        return {i: (first, self.last[i]) for i, first in enumerate(self.first) if first != NONE}


def lifetimes(plan: P.ExecutionPlan, loops: list[Lifetime]) -> Lifetimes:
    """First and last position of every value some instruction uses."""
    count = len(plan.values)
    table = Lifetimes(array("q", [NONE]) * count, array("q", [NONE]) * count)
    position = 0
    values = plan.values
    lists = (P.TensorList, P.OptionalTensorList)
    list_uses: dict[int, Lifetime] = {}  # tensor lists kernels and delegates read
    for chain in plan.chains:
        for instr in chain.instructions:
            for index in direct_operands(instr):
                table.touch(index, position, position)
            if isinstance(instr, (P.KernelCall, P.DelegateCall)):
                for index in instr.args:
                    if isinstance(values[index], lists):
                        first, _ = list_uses.get(index, (position, position))
                        list_uses[index] = (first, position)
            position += 1
    _pass_to_items(plan, list_uses, table)
    end = max(position - 1, 0)
    # Inputs are written before the first instruction, outputs read after
    # the last: the memory is held across the whole gap.
    for index in plan.inputs:
        table.touch(index, 0, table.last[index] if table.first[index] != NONE else 0)
    for index in plan.outputs:
        table.touch(index, table.first[index] if table.first[index] != NONE else end, end)
    budget = _WORK_PER_ENTRY * (count + len(loops) + position) + _WORK_FLOOR
    table.approximate = not _extend(table, loops, budget)
    return table


def _pass_to_items(plan: P.ExecutionPlan, list_uses: dict[int, Lifetime],
                   table: Lifetimes) -> None:
    """Items of a tensor list a call reads are used wherever the list is: each
    distinct list passes its lifetime on once, however many calls or values
    use it."""
    spans: dict[int, tuple[list[int], int, int]] = {}  # id(items) -> (items, first, last)
    for index, (first, last) in list_uses.items():
        value = plan.values[index]
        assert isinstance(value, (P.TensorList, P.OptionalTensorList))
        found = spans.get(id(value.items))
        if found is not None:
            first, last = min(first, found[1]), max(last, found[2])
        spans[id(value.items)] = (value.items, first, last)
    for items, first, last in spans.values():
        for item in items:
            if item >= 0:
                table.touch(item, first, last)


def _extend(table: Lifetimes, loops: list[Lifetime], budget: int) -> bool:
    """Extend lifetimes over loops (see `extend_over_loops`); False when the
    work ran past `budget` and loop regions were covered whole instead."""
    if not loops:
        return True
    used = array("q", (i for i, first in enumerate(table.first) if first != NONE))
    changed = True
    while changed:
        changed = False
        for start, end in loops:
            budget -= len(used)
            if budget < 0:
                _cover_regions(table, used, loops)
                return False
            first_of, last_of = table.first, table.last
            for index in used:
                first, last = first_of[index], last_of[index]
                inside = first <= end and last >= start
                outside = first < start or last > end
                covered = first <= start and last >= end
                if inside and outside and not covered:
                    first_of[index], last_of[index] = min(first, start), max(last, end)
                    changed = True
    return True


def _cover_regions(table: Lifetimes, used: array[int], loops: list[Lifetime]) -> None:
    """The approximation: merge overlapping loops into regions and extend every
    lifetime touching a region over all of it. It covers at least what the
    exact extension would (a loop only ever extends a lifetime within its
    region), so live bytes can only be overstated."""
    regions = merge_spans(list(loops))
    starts = [start for start, _ in regions]
    for index in used:
        first, last = table.first[index], table.last[index]
        k = max(bisect.bisect_right(starts, first) - 1, 0)
        while k < len(regions) and regions[k][0] <= last:
            start, end = regions[k]
            if end >= first:
                first, last = min(first, start), max(last, end)
            k += 1
        table.first[index], table.last[index] = first, last


def value_lifetimes(plan: P.ExecutionPlan, loops: list[Lifetime]) -> dict[int, Lifetime]:
    """First and last position of every value some instruction uses."""
    return lifetimes(plan, loops).as_dict()


def extend_over_loops(lifetimes: dict[int, Lifetime], loops: list[Lifetime]) -> None:
    """Keep a value used both inside and outside a loop live for all of it.

    Repeated until nothing changes, so nested and overlapping loops compose
    (extending over an inner loop can make a value cross an outer one).
    """
    keys = list(lifetimes)
    table = Lifetimes(array("q", [lifetimes[k][0] for k in keys]),
                      array("q", [lifetimes[k][1] for k in keys]))
    _extend(table, loops, _WORK_PER_ENTRY * (len(keys) + len(loops)) + _WORK_FLOOR)
    for i, key in enumerate(keys):
        lifetimes[key] = (table.first[i], table.last[i])


def merge_spans(spans: list[Lifetime]) -> list[Lifetime]:
    merged: list[Lifetime] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged
