"""Memory report: how a method's planned arenas are used over its run.

Everything comes from the `.pte` alone (ours or ExecuTorch's). Planned
tensors are the Tensor values with `allocation_info`; arena `memory_id` has
`non_const_buffer_sizes[memory_id]` bytes. A tensor's bytes are
prod(sizes) * element size (sizes are upper bounds for dynamic tensors).

Lifetimes are read off the instruction stream, with the chains of a method
numbered one after the other ("positions"): a value is live from the first
instruction that reads or writes it to the last one; method inputs are live
from position 0 and outputs to the end. A backward JumpFalseCall is a loop:
its body runs again, so a tensor used both inside the loop and outside it is
live through the whole loop.

Live bytes count each distinct memory region (memory_id, offset, size) once,
because several values may describe the same memory by design (the two ends
of a MoveCall, an alias). Two distinct regions whose bytes and lifetimes
both overlap would corrupt each other at run time: a planner bug, reported
as a warning.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from exirc.inspector.listing import instruction_text, source_of, value_type
from exirc.inspector.render import Style, clean, compact_bytes, plural
from exirc.serialize import program as P

# How many of the largest tensors live at the peak a report lists.
LARGEST_AT_PEAK = 5
# Warnings beyond this many are counted, not listed (a broken plan can
# produce thousands).
MAX_WARNINGS = 20

Lifetime = tuple[int, int]  # first and last position, inclusive


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
        return (f"arena {self.memory_id}: {_names(a)} (offset {a.offset}, {a.nbytes} B) and "
                f"{_names(b)} (offset {b.offset}, {b.nbytes} B) share bytes "
                f"{shared[0]}..{shared[1]} while both live at positions "
                f"{_span(self.positions)} (a memory planner bug?)")


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


def merge_spans(spans: list[Lifetime]) -> list[Lifetime]:
    merged: list[Lifetime] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


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


# --------------------------------------------------------------------------
# Text.
# --------------------------------------------------------------------------


def render_memory(reports: list[MethodMemory], bold: Style) -> str:
    lines: list[str] = []
    for report in reports:
        if lines:
            lines.append("")
        lines.extend(_render_method(report, bold))
    return "\n".join(lines)


def _render_method(report: MethodMemory, bold: Style) -> list[str]:
    tensors = sum(len(a.tensors) for a in report.arenas)
    lines = [bold(f"memory of method {clean(report.name)}: ") +
             f"{plural(report.instruction_count, 'instruction')}, "
             f"{plural(tensors, 'planned tensor')} in {plural(len(report.arenas), 'arena')}"
             + (f", {plural(len(report.loops), 'loop')}" if report.loops else "")]
    if not report.arenas:
        lines.append("  no planned memory")
    for arena in report.arenas:
        lines.extend(_render_arena(arena))
    if report.warnings:
        lines.append(f"  warnings ({len(report.warnings)}):")
        lines.extend(f"    {clean(w.message)}" for w in report.warnings[:MAX_WARNINGS])
        if len(report.warnings) > MAX_WARNINGS:
            lines.append(f"    ... {len(report.warnings) - MAX_WARNINGS} more (see --json)")
    return lines


def _render_arena(arena: ArenaReport) -> list[str]:
    indent = " " * 19  # continuation lines line up with the figures
    shared = " (shared by every method, kept from run to run: program state)" \
        if arena.memory_id >= P.FIRST_SHARED_BUFFER else ""
    lines = [f"  arena {arena.memory_id}: {plural(len(arena.tensors), 'planned tensor')}{shared}",
             f"    size           {compact_bytes(arena.size)}"]
    if arena.peak_position is None:
        lines.append("    peak live      0 B (nothing is ever live)")
        return lines
    share = f"{100 * arena.peak_bytes / arena.size:.1f}% of the arena" if arena.size else ""
    lines.append(f"    peak live      {compact_bytes(arena.peak_bytes)} ({share})")
    site = arena.peak_site
    if site is None:
        lines.append(f"{indent}before any instruction (the method has none)")
    else:
        chain = f" of chain {site.chain}" if site.chain else ""
        lines.append(f"{indent}at instruction {site.index}{chain}: {clean(site.text)}")
        if site.source and site.source.get("file"):
            code = f": {site.source['code']}" if site.source.get("code") else ""
            lines.append(f"{indent}{clean(site.source['file'])}:{site.source['line']}"
                         f"{clean(code)}")
    lines.append(f"    fragmentation  {100 * arena.fragmentation:.1f}% "
                 f"({compact_bytes(arena.wasted_bytes)} more than the peak needs)")
    lines.append("    largest tensors live at the peak:")
    header = ("value", "type", "bytes", "offset", "live at")
    rows = [header] + [
        (_names(b), clean(b.tensors[0].type), compact_bytes(b.nbytes), str(b.offset),
         ", ".join(_span(s) for s in b.live))
        for b in arena.largest_at_peak]
    widths = [max(len(row[k]) for row in rows) for k in range(len(header))]
    for row in rows:
        lines.append("      " + "  ".join([
            row[0].ljust(widths[0]), row[1].ljust(widths[1]), row[2].rjust(widths[2]),
            row[3].rjust(widths[3]), row[4]]))
    return lines


def _names(block: Block) -> str:
    """`%5`, or `%5=%9` for values that describe the same memory."""
    return "=".join(f"%{v}" for v in block.values)


def _span(span: Lifetime) -> str:
    first, last = span
    return str(first) if first == last else f"{first}..{last}"
