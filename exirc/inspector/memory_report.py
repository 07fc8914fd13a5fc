"""Memory report: how a method's planned arenas are used over its run.

Everything comes from the `.pte` alone (ours or ExecuTorch's). Planned
tensors are the Tensor values with `allocation_info`; arena `memory_id` has
`non_const_buffer_sizes[memory_id]` bytes. A tensor's bytes are
prod(sizes) * element size (sizes are upper bounds for dynamic tensors).

Lifetimes are read off the instruction stream (`value_lifetimes`): a value
is live from the first instruction ("position", the chains numbered one after
the other) that reads or writes it to the last one, loops included.

Live bytes count each distinct memory region (memory_id, offset, size) once,
because several values may describe the same memory by design (the two ends
of a MoveCall, an alias). Two distinct regions whose bytes and lifetimes
both overlap would corrupt each other at run time: a planner bug, reported
as a warning. `memory_report_text` and `memory_report_html` render the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exirc.inspector.listing import instruction_text, source_of, value_type
from exirc.inspector.value_lifetimes import (
    Lifetime,
    loop_ranges,
    merge_spans,
    value_lifetimes,
)
from exirc.serialize import program as P

# How many of the largest tensors live at the peak a report lists.
LARGEST_AT_PEAK = 5
# Warnings beyond this many are counted, not listed (a broken plan can
# produce thousands).
MAX_WARNINGS = 20


@dataclass(frozen=True)
class InstructionSite:
    """Where a position is: its chain, index there, text and source line."""

    position: int
    chain: int
    index: int
    text: str
    source: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        return {"position": self.position, "chain": self.chain, "index": self.index,
                "text": self.text, "source": self.source}


@dataclass(frozen=True)
class PlannedTensor:
    value: int
    memory_id: int
    offset: int
    nbytes: int
    type: str  # e.g. "f32[3, 8]"
    lifetime: Lifetime | None  # None: no instruction uses it

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "type": self.type, "offset": self.offset,
                "bytes": self.nbytes,
                "lifetime": None if self.lifetime is None else list(self.lifetime)}


@dataclass
class Block:
    """One distinct region of an arena and the values that describe it."""

    memory_id: int
    offset: int
    nbytes: int
    tensors: list[PlannedTensor] = field(default_factory=list)
    # Merged lifetimes of its tensors: when the region holds live data.
    live: list[Lifetime] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    @property
    def values(self) -> list[int]:
        return [t.value for t in self.tensors]

    def live_at(self, position: int) -> bool:
        return any(first <= position <= last for first, last in self.live)

    def to_json(self) -> dict[str, Any]:
        first = self.tensors[0]
        return {"values": self.values, "type": first.type, "offset": self.offset,
                "bytes": self.nbytes, "lifetimes": [list(span) for span in self.live]}


@dataclass
class ArenaReport:
    memory_id: int
    size: int
    tensors: list[PlannedTensor]
    blocks: list[Block]
    live_bytes: list[int]  # per position
    peak_bytes: int
    peak_position: int | None  # None when nothing is ever live
    peak_site: InstructionSite | None  # also None in a method without instructions
    largest_at_peak: list[Block]

    @property
    def wasted_bytes(self) -> int:
        """Arena bytes never needed, even at the peak."""
        return max(0, self.size - self.peak_bytes)

    @property
    def fragmentation(self) -> float:
        return 1 - self.peak_bytes / self.size if self.size else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "memory_id": self.memory_id,
            "size": self.size,
            "peak_bytes": self.peak_bytes,
            "peak_position": self.peak_position,
            "peak_instruction": None if self.peak_site is None else self.peak_site.to_json(),
            "fragmentation": round(self.fragmentation, 6),
            "wasted_bytes": self.wasted_bytes,
            "planned_tensors": len(self.tensors),
            "largest_at_peak": [block.to_json() for block in self.largest_at_peak],
            "tensors": [tensor.to_json() for tensor in self.tensors],
            "live_bytes": self.live_bytes,
        }


@dataclass(frozen=True)
class OverlapWarning:
    """Two distinct regions sharing bytes while both hold live data."""

    memory_id: int
    first: Block
    second: Block
    positions: Lifetime

    @property
    def message(self) -> str:
        a, b = self.first, self.second
        shared = (max(a.offset, b.offset), min(a.end, b.end))
        return (f"arena {self.memory_id}: {block_names(a)} (offset {a.offset}, {a.nbytes} B) and "
                f"{block_names(b)} (offset {b.offset}, {b.nbytes} B) share bytes "
                f"{shared[0]}..{shared[1]} while both live at positions "
                f"{span_text(self.positions)} (a memory planner bug?)")


@dataclass
class MethodMemory:
    name: str
    instruction_count: int
    loops: list[Lifetime]  # (first, last) positions of each loop body
    arenas: list[ArenaReport]
    warnings: list[OverlapWarning]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "instruction_count": self.instruction_count,
            "loops": [list(loop) for loop in self.loops],
            "arenas": [arena.to_json() for arena in self.arenas],
            "warnings": [w.message for w in self.warnings[:MAX_WARNINGS]],
            "warning_count": len(self.warnings),
        }


def block_names(block: Block) -> str:
    """`%5`, or `%5=%9` for values that describe the same memory."""
    return "=".join(f"%{v}" for v in block.values)


def span_text(span: Lifetime) -> str:
    first, last = span
    return str(first) if first == last else f"{first}..{last}"


# --------------------------------------------------------------------------
# Analysis.
# --------------------------------------------------------------------------


def memory_report(program: P.Program) -> list[MethodMemory]:
    return [method_memory(plan) for plan in program.execution_plan]


def method_memory(plan: P.ExecutionPlan) -> MethodMemory:
    count = sum(len(chain.instructions) for chain in plan.chains)
    loops = loop_ranges(plan)
    lifetimes = value_lifetimes(plan, loops)
    tensors = planned_tensors(plan, lifetimes)
    # A method without instructions still holds its inputs and outputs at
    # "position 0", so there is always at least one position to chart.
    positions = max(count, 1)
    arenas = []
    warnings: list[OverlapWarning] = []
    for memory_id, size in enumerate(plan.non_const_buffer_sizes):
        mine = [t for t in tensors if t.memory_id == memory_id]
        if not mine and not size:
            continue  # entry 0 is reserved and normally empty
        blocks = group_blocks(mine)
        arenas.append(arena_report(plan, memory_id, size, mine, blocks, positions))
        warnings.extend(overlaps(memory_id, blocks))
    return MethodMemory(plan.name, count, loops, arenas, warnings)


def planned_tensors(plan: P.ExecutionPlan, lifetimes: dict[int, Lifetime]
                    ) -> list[PlannedTensor]:
    tensors = []
    for index, value in enumerate(plan.values):
        if isinstance(value, P.Tensor) and value.allocation_info is not None:
            info = value.allocation_info
            tensors.append(PlannedTensor(index, info.memory_id, info.offset, value.nbytes,
                                         value_type(value), lifetimes.get(index)))
    return tensors


def group_blocks(tensors: list[PlannedTensor]) -> list[Block]:
    """Distinct regions, ordered by offset, with their merged lifetimes."""
    blocks: dict[tuple[int, int], Block] = {}
    for tensor in tensors:
        key = (tensor.offset, tensor.nbytes)
        if key not in blocks:
            blocks[key] = Block(tensor.memory_id, tensor.offset, tensor.nbytes)
        blocks[key].tensors.append(tensor)
    for block in blocks.values():
        block.live = merge_spans([t.lifetime for t in block.tensors if t.lifetime is not None])
    return sorted(blocks.values(), key=lambda b: (b.offset, b.nbytes))


def arena_report(plan: P.ExecutionPlan, memory_id: int, size: int,
                 tensors: list[PlannedTensor], blocks: list[Block],
                 positions: int) -> ArenaReport:
    # Live bytes per position by a difference array: linear in positions
    # plus lifetimes, where checking every block at every position would be
    # quadratic on large models.
    delta = [0] * (positions + 1)
    for block in blocks:
        for first, last in block.live:
            delta[first] += block.nbytes
            delta[last + 1] -= block.nbytes
    live_bytes = []
    running = 0
    for change in delta[:positions]:
        running += change
        live_bytes.append(running)
    peak = max(live_bytes, default=0)
    if peak == 0:
        return ArenaReport(memory_id, size, tensors, blocks, live_bytes, 0, None, None, [])
    position = live_bytes.index(peak)  # the first time the peak is reached
    live = [b for b in blocks if b.live_at(position)]
    largest = sorted(live, key=lambda b: (-b.nbytes, b.offset))[:LARGEST_AT_PEAK]
    return ArenaReport(memory_id, size, tensors, blocks, live_bytes, peak, position,
                       instruction_site(plan, position), largest)


def instruction_site(plan: P.ExecutionPlan, position: int) -> InstructionSite | None:
    start = 0
    for c, chain in enumerate(plan.chains):
        if position < start + len(chain.instructions):
            i = position - start
            frames = chain.stacktrace[i].items if chain.stacktrace else []
            return InstructionSite(position, c, i, instruction_text(plan, chain.instructions[i]),
                                   source_of(frames))
        start += len(chain.instructions)
    return None  # a method without instructions


def overlaps(memory_id: int, blocks: list[Block]) -> list[OverlapWarning]:
    """Pairs of distinct regions that share bytes while both are live."""
    found = []
    # Blocks are sorted by offset, so only the following blocks that start
    # before this one ends can share bytes with it.
    for i, a in enumerate(blocks):
        for b in blocks[i + 1:]:
            if b.offset >= a.end:
                break
            if not a.nbytes or not b.nbytes:
                continue
            shared = _shared_positions(a.live, b.live)
            if shared is not None:
                found.append(OverlapWarning(memory_id, a, b, shared))
    return found


def _shared_positions(a: list[Lifetime], b: list[Lifetime]) -> Lifetime | None:
    for a_first, a_last in a:
        for b_first, b_last in b:
            first, last = max(a_first, b_first), min(a_last, b_last)
            if first <= last:
                return first, last
    return None
