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

Costs follow the file, however it is shaped: planned tensors, regions and
their live spans are kept as arrays, not objects; an arena's live bytes are
a step function (they change only where a region's life starts or ends),
not one number per instruction; arenas, their tensors and per-position
figures are made when a view asks for them; and the search for overlapping
regions is bounded work (past it the report says the check was cut short).
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy

from exirc.inspector.arena_steps import ArenaSteps, arena_steps
from exirc.inspector.lazy_json import SLOT, Lazy, Template
from exirc.inspector.listing import instruction_text, source_of
from exirc.inspector.planned_regions import Block, PlannedRegions, PlannedTensor
from exirc.inspector.value_lifetimes import Lifetime, lifetimes, loop_ranges
from exirc.serialize import program as P
from exirc.serialize.module_paths import stored_module_paths

# How many of the largest tensors live at the peak a report lists.
LARGEST_AT_PEAK = 5
# Warnings beyond this many are counted, not listed (a broken plan can
# produce thousands).
MAX_WARNINGS = 20
# Per-position live bytes a method's JSON gives at most, over all its arenas
# (`live_steps` always has the same figures, compactly).
MAX_LIVE_BYTES = 1 << 22
# Arenas whose steps are made together (`arena_steps`).
_ARENAS_AT_ONCE = 4096
# Pairs of regions the overlap check may compare, per region and in all.
_PAIRS_PER_BLOCK = 64
_PAIRS_FLOOR = 1 << 20

@dataclass(frozen=True, slots=True)
class InstructionSite:
    """Where a position is: its chain, index there, text, source line and the
    submodule it came from ("" if unknown)."""

    position: int
    chain: int
    index: int
    text: str
    source: dict[str, Any] | None
    module: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"position": self.position, "chain": self.chain, "index": self.index,
                "text": self.text, "source": self.source, "module": self.module or None}


class ArenaReport:
    """One arena of a method: its size, its planned tensors and how many of its
    bytes are live at each position (a step function: `live_steps`)."""

    def __init__(self, planned: PlannedRegions, memory_id: int, size: int, positions: int,
                 ranges: tuple[int, int, int, int] | None, steps: ArenaSteps | None,
                 index: int | None, modules: list[list[str]] | None = None) -> None:
        """`steps`: the method's `arena_steps`, where this arena is at `index`
        (both None for an arena without planned tensors)."""
        self._planned = planned
        self.memory_id = memory_id
        self.size = size
        self.positions = positions
        self._ranges = ranges or (0, 0, 0, 0)
        self.peak_bytes = 0
        self.peak_position: int | None = None  # None when nothing is ever live
        self.peak_site: InstructionSite | None = None  # also None without instructions
        self.largest_at_peak: list[Block] = []
        if steps is None or index is None:
            self._step_at = self._step_live = numpy.zeros(0, dtype=numpy.int64)
            return
        lo, hi = steps.lo.data[index], steps.hi.data[index]
        self._step_at, self._step_live = steps.at[lo:hi], steps.live[lo:hi]
        self.peak_bytes = steps.peak.data[index]
        if self.peak_bytes > 0:
            # The first time the peak is reached.
            self.peak_position = steps.peak_at.data[index]
            self.peak_site = instruction_site(planned.plan, self.peak_position, modules)
            largest = steps.largest[steps.largest_lo.data[index]:steps.largest_hi.data[index]]
            self.largest_at_peak = [planned.block(b) for b in largest.data]

    @property
    def live_steps(self) -> list[tuple[int, int]]:
        """(position, live bytes from there on) wherever the figure changes."""
        return list(zip(self._step_at.tolist(), self._step_live.tolist()))

    @property
    def tensor_count(self) -> int:
        lo, hi, _, _ = self._ranges
        return hi - lo

    @property
    def tensors(self) -> Lazy[PlannedTensor]:
        """The arena's planned tensors, in value order."""
        lo, hi, _, _ = self._ranges
        planned = self._planned

        def made() -> Iterator[PlannedTensor]:
            by_value = numpy.argsort(planned.value[lo:hi], kind="stable") + lo
            for k in by_value.data:
                yield planned.tensor(k)
        return Lazy(hi - lo, made)

    @property
    def blocks(self) -> list[Block]:
        _, _, b_lo, b_hi = self._ranges
        return [self._planned.block(b) for b in range(b_lo, b_hi)]

    @property
    def live_bytes(self) -> list[int]:
        """Live bytes at each position."""
        return list(self.live_bytes_lazy())

    def live_bytes_lazy(self) -> Lazy[int]:
        def made() -> Iterator[int]:
            at, figures = self._step_at.data, self._step_live.data
            live, k, count = 0, 0, len(at)
            for position in range(self.positions):
                while k < count and at[k] <= position:
                    live = figures[k]
                    k += 1
                yield live
        return Lazy(self.positions, made)

    @property
    def wasted_bytes(self) -> int:
        """Arena bytes never needed, even at the peak."""
        return max(0, self.size - self.peak_bytes)

    @property
    def fragmentation(self) -> float:
        return 1 - self.peak_bytes / self.size if self.size else 0.0

    def to_json(self, *, per_position: bool = True) -> dict[str, Any]:
        return {
            "memory_id": self.memory_id,
            "size": self.size,
            "peak_bytes": self.peak_bytes,
            "peak_position": self.peak_position,
            "peak_instruction": None if self.peak_site is None else self.peak_site.to_json(),
            "fragmentation": round(self.fragmentation, 6),
            "wasted_bytes": self.wasted_bytes,
            "planned_tensors": self.tensor_count,
            "largest_at_peak": [block.to_json() for block in self.largest_at_peak],
            "tensors": Lazy(self.tensor_count, lambda: (t.to_json() for t in self.tensors)),
            "live_bytes": self.live_bytes_lazy() if per_position else None,
            "live_steps": Lazy(len(self._step_at), lambda: (
                [int(p), int(b)] for p, b in zip(self._step_at.data, self._step_live.data))),
        }


@dataclass(frozen=True, slots=True)
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


class MethodMemory:
    """A method's memory report: its arenas (made as they are asked for) and
    the regions that overlap while live."""

    def __init__(self, name: str, instruction_count: int, loops: list[Lifetime],
                 planned: PlannedRegions, sizes: list[int], approximate: bool,
                 modules: list[list[str]] | None = None) -> None:
        """`modules`: per chain, the submodule each instruction came from, if stored."""
        self.name = name
        self._modules = modules
        self.instruction_count = instruction_count
        self.loops = loops  # (first, last) positions of each loop body
        self.lifetimes_approximate = approximate
        self._planned = planned
        self._sizes = sizes
        self._ranges = planned.arena_ranges()
        self._steps: tuple[range, ArenaSteps] | None = None  # the last batch of arenas
        # Whether each arena has planned tensors (a byte each: cheaper than a set).
        self._with_tensors = bytearray(len(sizes))
        for memory_id in self._ranges.ids.data:
            if memory_id < len(sizes):
                self._with_tensors[memory_id] = 1
        # Arenas with bytes or tensors (entry 0 is reserved and normally empty).
        self.arena_ids = array("q", (i for i, size in enumerate(sizes)
                                     if size or self._with_tensors[i]))
        self.planned_tensors = len(planned.value)
        self.warnings: list[OverlapWarning] = []
        self.warning_count = 0
        self.warnings_complete = True
        self._find_overlaps()

    @property
    def arenas(self) -> Lazy[ArenaReport]:
        return Lazy(len(self.arena_ids), lambda: (self.arena(i) for i in self.arena_ids))

    def arena(self, memory_id: int) -> ArenaReport:
        size = self._sizes[memory_id] if memory_id < len(self._sizes) else 0
        positions = max(self.instruction_count, 1)
        k = self._ranges.index(memory_id)
        if k is None:
            return ArenaReport(self._planned, memory_id, size, positions, None, None, None)
        batch = range(k - k % _ARENAS_AT_ONCE,
                      min(k - k % _ARENAS_AT_ONCE + _ARENAS_AT_ONCE, len(self._ranges.ids)))
        if self._steps is None or self._steps[0] != batch:  # arenas are asked for in order
            self._steps = batch, arena_steps(self._planned, self._ranges, batch, positions,
                                             LARGEST_AT_PEAK)
        return ArenaReport(self._planned, memory_id, size, positions, self._ranges.get(memory_id),
                           self._steps[1], k - batch.start, self._modules)

    def site(self, position: int) -> InstructionSite | None:
        """The instruction at `position`: its chain, index, text and source line."""
        return instruction_site(self._planned.plan, position, self._modules)

    def _find_overlaps(self) -> None:
        """Pairs of distinct regions that share bytes while both are live.

        Regions are sorted by offset, so only the following regions that start
        before one ends can share bytes with it. The pairs compared are
        bounded: a file can make every region overlap every other."""
        planned = self._planned
        budget = _PAIRS_PER_BLOCK * len(planned.block_start) + _PAIRS_FLOOR
        starts = planned.block_start
        ids, offsets, sizes = (column[starts].data for column in
                               (planned.memory_id, planned.offset, planned.nbytes))
        for a in range(len(ids)):
            if not sizes[a]:
                continue
            end = offsets[a] + sizes[a]
            for b in range(a + 1, len(ids)):
                if ids[b] != ids[a] or offsets[b] >= end:
                    break
                budget -= 1
                if budget < 0:
                    self.warnings_complete = False
                    return
                if not sizes[b]:
                    continue
                shared = _shared_positions(planned.spans_of(a), planned.spans_of(b))
                if shared is None:
                    continue
                self.warning_count += 1
                if len(self.warnings) < MAX_WARNINGS:
                    self.warnings.append(OverlapWarning(ids[a], planned.block(a),
                                                        planned.block(b), shared))

    def to_json(self) -> dict[str, Any]:
        per_position = max(self.instruction_count, 1) * len(self.arena_ids) <= MAX_LIVE_BYTES
        return {
            "name": self.name,
            "instruction_count": self.instruction_count,
            "loops": [list(loop) for loop in self.loops],
            "lifetimes_approximate": self.lifetimes_approximate,
            "arenas": empty_arena_template(max(self.instruction_count, 1), per_position).rows(
                len(self.arena_ids), lambda: self._arenas_json(per_position)),
            "warnings": [w.message for w in self.warnings[:MAX_WARNINGS]],
            "warning_count": self.warning_count,
            "warnings_complete": self.warnings_complete,
        }

    def _arenas_json(self, per_position: bool) -> Iterator[dict[str, Any] | tuple[int, ...]]:
        """Each arena's JSON; an arena no tensor is planned in (a plan can list
        a hundred thousand) as its row of `empty_arena_template`, unanalysed."""
        sizes, with_tensors = self._sizes, self._with_tensors
        for i in self.arena_ids:
            if with_tensors[i]:
                yield self.arena(i).to_json(per_position=per_position)
            else:  # listed because it has bytes, all of them wasted
                yield i, sizes[i], sizes[i]


def empty_arena_template(positions: int, per_position: bool) -> Template:
    """`ArenaReport.to_json` of an arena of some bytes where no tensor is
    planned: nothing is ever live in it, so all of it is wasted. Its rows are
    (memory_id, size, wasted_bytes)."""
    zeros = Lazy(positions, lambda: itertools.repeat(0, positions))
    return Template({
        "memory_id": SLOT, "size": SLOT, "peak_bytes": 0, "peak_position": None,
        "peak_instruction": None, "fragmentation": 1.0, "wasted_bytes": SLOT,
        "planned_tensors": 0, "largest_at_peak": [], "tensors": [],
        "live_bytes": zeros if per_position else None, "live_steps": [],
    })


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
    modules = stored_module_paths(program)
    return [method_memory(plan, modules.of_plan(plan)) for plan in program.execution_plan]


def method_memory(plan: P.ExecutionPlan,
                  modules: list[list[str]] | None = None) -> MethodMemory:
    count = sum(len(chain.instructions) for chain in plan.chains)
    loops = loop_ranges(plan)
    table = lifetimes(plan, loops)
    first = numpy.frombuffer(table.first, dtype=numpy.int64) if len(table.first) \
        else numpy.zeros(0, dtype=numpy.int64)
    last = numpy.frombuffer(table.last, dtype=numpy.int64) if len(table.last) \
        else numpy.zeros(0, dtype=numpy.int64)
    planned = PlannedRegions(plan, first, last)
    return MethodMemory(plan.name, count, loops, planned, plan.non_const_buffer_sizes,
                        table.approximate, modules)


def instruction_site(plan: P.ExecutionPlan, position: int,
                     modules: list[list[str]] | None = None) -> InstructionSite | None:
    start = 0
    for c, chain in enumerate(plan.chains):
        if position < start + len(chain.instructions):
            i = position - start
            frames = chain.stacktrace[i].items if chain.stacktrace else []
            return InstructionSite(position, c, i, instruction_text(plan, chain.instructions[i]),
                                   source_of(frames), modules[c][i] if modules else "")
        start += len(chain.instructions)
    return None  # a method without instructions


def _shared_positions(a: list[Lifetime], b: list[Lifetime]) -> Lifetime | None:
    """The first span where two sorted, merged span lists overlap, or None."""
    i = j = 0
    while i < len(a) and j < len(b):
        first, last = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if first <= last:
            return first, last
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return None
