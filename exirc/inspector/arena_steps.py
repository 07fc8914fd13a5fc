"""Every arena's live-bytes step function, peak and largest regions at the
peak, for all of a method's arenas at once.

A plan can list hundreds of thousands of arenas. Computed arena by arena,
each cost a dozen numpy calls of a few microseconds each on arrays of a
handful of entries: seconds for work that is a few sorts over the live
spans of many arenas together. Here each figure is one pass over the spans
of a few thousand arenas (`MethodMemory` asks for them so, in order); an
`ArenaReport` takes its slices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy

from exirc.inspector.planned_regions import ArenaRanges, Array, PlannedRegions


@dataclass(frozen=True)
class ArenaSteps:
    """Per arena `k` (of those asked for): its steps are
    `at[lo[k]:hi[k]]` (positions where its live bytes change, ascending) and
    `live[...]` (its live bytes from each on); its peak bytes `peak[k]`, first
    reached at `peak_at[k]` (-1 when nothing is ever live); the regions
    largest at the peak, largest first, `largest[largest_lo[k]:largest_hi[k]]`."""

    at: Array
    live: Array
    lo: Array
    hi: Array
    peak: Array
    peak_at: Array
    largest: Array
    largest_lo: Array
    largest_hi: Array


def arena_steps(planned: PlannedRegions, ranges: ArenaRanges, chosen: range, positions: int,
                most: int) -> ArenaSteps:
    """The steps over `positions` positions of arenas `chosen` (indices into
    `ranges`; an `ArenaSteps` index `k` is arena `chosen[k]`), and their
    `most` regions largest at the peak. Made for a few thousand arenas at a
    time, so what the sorts hold at once stays small."""
    a0, a1 = chosen.start, chosen.stop
    b0, b1 = int(ranges.block_lo[a0]), int(ranges.block_hi[a1 - 1])
    s0, s1 = int(planned.span_start[b0]), int(planned.span_start[b1])
    arenas = numpy.arange(a1 - a0, dtype=numpy.int64)
    arena_of_block = numpy.repeat(arenas, ranges.block_hi[a0:a1] - ranges.block_lo[a0:a1])
    block_of_span = numpy.repeat(numpy.arange(b1 - b0, dtype=numpy.int64),
                                 numpy.diff(planned.span_start[b0:b1 + 1]))
    size = planned.nbytes[planned.block_start[b0:b1]][block_of_span]
    arena = arena_of_block[block_of_span]
    first, last = planned.span_first[s0:s1], planned.span_last[s0:s1]
    at = numpy.concatenate((first, last + 1))
    who = numpy.concatenate((arena, arena))
    order = numpy.lexsort((at, who))
    at, who = at[order], who[order]
    # One running sum for all: each arena's changes add up to nothing, so the
    # sum is back at 0 where the next arena's begin.
    running = numpy.cumsum(numpy.concatenate((size, -size))[order])
    del order, size
    # The figure after all changes at one position: the last of each run.
    ends = numpy.append(numpy.flatnonzero((numpy.diff(at) != 0) | (numpy.diff(who) != 0)),
                        len(at) - 1) if len(at) else numpy.zeros(0, dtype=numpy.int64)
    keep = ends[at[ends] < positions]
    at, who, live = at[keep], who[keep], running[keep]
    del running, ends, keep
    lo = numpy.searchsorted(who, arenas, side="left")
    hi = numpy.searchsorted(who, arenas, side="right")
    peak = numpy.zeros(len(arenas), dtype=numpy.int64)
    peak_at = numpy.full(len(arenas), -1, dtype=numpy.int64)
    stepped = numpy.flatnonzero(hi > lo)
    if len(stepped):
        peak[stepped] = numpy.maximum.reduceat(live, lo[stepped])
        steps = numpy.arange(len(live), dtype=numpy.int64)
        at_peak = numpy.minimum.reduceat(numpy.where(live == peak[who], steps, len(live)),
                                         lo[stepped])
        peaked = stepped[peak[stepped] > 0]
        peak_at[peaked] = at[at_peak[peak[stepped] > 0]]
    # The live regions at each arena's peak.
    when = peak_at[arena]
    alive = (peak[arena] > 0) & (first <= when) & (last >= when)
    blocks = numpy.unique(block_of_span[alive]) + b0  # ascending: arena by arena
    largest, largest_lo, largest_hi = _largest(planned, ranges.block_lo[a0:a1], blocks, most)
    return ArenaSteps(at, live, lo, hi, peak, peak_at, largest, largest_lo, largest_hi)


def _largest(planned: PlannedRegions, block_lo: Array, blocks: Array,
             most: int) -> tuple[Array, Array, Array]:
    """Of `blocks`, each arena's `most` largest (then by offset); arenas start
    at blocks `block_lo`."""
    starts = planned.block_start[blocks]
    owner = numpy.searchsorted(block_lo, blocks, side="right") - 1
    order = numpy.lexsort((planned.offset[starts], -planned.nbytes[starts], owner))
    blocks, owner = blocks[order], owner[order]
    group = numpy.searchsorted(owner, owner, side="left")
    chosen = numpy.arange(len(blocks)) - group < most
    blocks, owner = blocks[chosen], owner[chosen]
    arenas = numpy.arange(len(block_lo), dtype=numpy.int64)
    return (blocks, numpy.searchsorted(owner, arenas, side="left"),
            numpy.searchsorted(owner, arenas, side="right"))
