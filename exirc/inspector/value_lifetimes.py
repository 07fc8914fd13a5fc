"""When each value of a method holds data: lifetimes read off the instruction stream.

The chains of a method are numbered one after the other ("positions"): a
value is live from the first instruction that reads or writes it to the last
one; method inputs are live from position 0 and outputs to the end. A
backward JumpFalseCall is a loop: its body runs again, so a tensor used both
inside the loop and outside it is live through the whole loop.
"""

from __future__ import annotations

from collections.abc import Iterator

from exirc.serialize import program as P

Lifetime = tuple[int, int]  # first and last position, inclusive


def touched_values(plan: P.ExecutionPlan, instr: P.Instruction) -> Iterator[int]:
    """Value indices an instruction reads or writes, list items included."""
    if isinstance(instr, (P.KernelCall, P.DelegateCall)):
        for index in instr.args:
            yield index
            value = plan.values[index]
            if isinstance(value, (P.TensorList, P.OptionalTensorList)):
                yield from (item for item in value.items if item >= 0)
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


def value_lifetimes(plan: P.ExecutionPlan, loops: list[Lifetime]) -> dict[int, Lifetime]:
    """First and last position of every value some instruction uses."""
    lifetimes: dict[int, Lifetime] = {}

    def touch(index: int, first: int, last: int) -> None:
        old = lifetimes.get(index)
        lifetimes[index] = (first, last) if old is None else (min(old[0], first),
                                                              max(old[1], last))

    position = 0
    for chain in plan.chains:
        for instr in chain.instructions:
            for index in touched_values(plan, instr):
                touch(index, position, position)
            position += 1
    end = max(position - 1, 0)
    # Inputs are written before the first instruction, outputs read after
    # the last: the memory is held across the whole gap.
    for index in plan.inputs:
        touch(index, 0, lifetimes.get(index, (0, 0))[1])
    for index in plan.outputs:
        touch(index, lifetimes.get(index, (end, end))[0], end)
    extend_over_loops(lifetimes, loops)
    return lifetimes


def extend_over_loops(lifetimes: dict[int, Lifetime], loops: list[Lifetime]) -> None:
    """Keep a value used both inside and outside a loop live for all of it.

    Repeated until nothing changes, so nested and overlapping loops compose
    (extending over an inner loop can make a value cross an outer one).
    """
    changed = bool(loops)
    while changed:
        changed = False
        for start, end in loops:
            for index, (first, last) in lifetimes.items():
                inside = first <= end and last >= start
                outside = first < start or last > end
                covered = first <= start and last >= end
                if inside and outside and not covered:
                    lifetimes[index] = (min(first, start), max(last, end))
                    changed = True


def merge_spans(spans: list[Lifetime]) -> list[Lifetime]:
    merged: list[Lifetime] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged
