"""Choosing what to mutate: a method, a value of some kind, an instruction.

Every pick takes the mutant's `random.Random`, so a (base, kind, seed) triple
always picks the same things. A pick returns None when the program has
nothing of the kind asked for; the mutation then does not apply.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

from exirc.serialize import program as P

T = TypeVar("T")

# Ints a file can hold where a size, a dim, an index or a count goes: the
# edges where a check is off by one, a product overflows, a sign flips.
EDGE_INTS = [0, 1, -1, 2, -2, 3, 7, 8, 64, 255, 256, 4097, 65536, 2**31 - 1, -(2**31), 2**31,
             2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, -(2**63)]
# The same, within a 32-bit signed field (tensor sizes, value indices).
EDGE_INT32 = [v for v in EDGE_INTS if -(2**31) <= v < 2**31]
EDGE_UINT32 = [v for v in EDGE_INTS if 0 <= v < 2**32]


def choice(rng: random.Random, items: Sequence[T]) -> T | None:
    return items[rng.randrange(len(items))] if items else None


def plan(program: P.Program, rng: random.Random) -> P.ExecutionPlan | None:
    return choice(rng, program.execution_plan)


def value_indices(plan: P.ExecutionPlan, *kinds: type) -> list[int]:
    """Indices of the plan's values of the given kinds (all values if none given)."""
    return [i for i, v in enumerate(plan.values) if not kinds or isinstance(v, kinds)]


def tensors(plan: P.ExecutionPlan, *, planned: bool | None = None,
            constant: bool | None = None) -> list[int]:
    found = []
    for i, value in enumerate(plan.values):
        if not isinstance(value, P.Tensor):
            continue
        if planned is not None and (value.allocation_info is not None) != planned:
            continue
        if constant is not None and (value.data_buffer_idx > 0) != constant:
            continue
        found.append(i)
    return found


def instructions(plan: P.ExecutionPlan, *kinds: type) -> list[tuple[P.Chain, int]]:
    """(chain, position) of every instruction of the given kinds."""
    return [(chain, i) for chain in plan.chains for i, instr in enumerate(chain.instructions)
            if not kinds or isinstance(instr, kinds)]


def kernel_calls(plan: P.ExecutionPlan) -> list[P.KernelCall]:
    return [instr for chain in plan.chains for instr in chain.instructions
            if isinstance(instr, P.KernelCall)]


def any_value(plan: P.ExecutionPlan, rng: random.Random) -> int:
    """A value index: mostly a real one, sometimes just out of range or negative."""
    count = len(plan.values)
    roll = rng.random()
    if roll < 0.9 and count:
        return rng.randrange(count)
    return rng.choice([count, count + 1, -1, -2, 2**31 - 1])
