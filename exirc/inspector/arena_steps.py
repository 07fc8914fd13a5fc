"""Every arena's live-bytes step function, peak and largest regions at the
peak, for all of a method's arenas at once.

A plan can list hundreds of thousands of arenas. Computed arena by arena,
each cost a dozen numpy calls of a few microseconds each on arrays of a
handful of entries: seconds for work that is a few sorts over all of the
method's live spans together. Here each figure is one pass over every
arena's spans; an `ArenaReport` takes its slices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy

from exirc.inspector.planned_regions import ArenaRanges, Array, PlannedRegions


@dataclass(frozen=True)
class ArenaSteps:
    """Per arena `k` of an `ArenaRanges` (its order): its steps are
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


def arena_steps(planned: PlannedRegions, ranges: ArenaRanges, positions: int,
                most: int) -> ArenaSteps:
    """The steps of every arena of `ranges` over `positions` positions, and
    its `most` regions largest at its peak."""
    arenas = numpy.arange(len(ranges.ids), dtype=numpy.int64)
    blocks = len(planned.block_start)
    arena_of_block = numpy.repeat(arenas, ranges.block_hi - ranges.block_lo)
    block_of_span = numpy.repeat(numpy.arange(blocks, dtype=numpy.int64),
                                 numpy.diff(planned.span_start))
    block_bytes = planned.nbytes[planned.block_start]
    size = block_bytes[block_of_span]
    arena = arena_of_block[block_of_span]
    at = numpy.concatenate((planned.span_first, planned.span_last + 1))
    who = numpy.concatenate((arena, arena))
    order = numpy.lexsort((at, who))
    at, who = at[order], who[order]
    # One running sum for all: each arena's changes add up to nothing, so the
    # sum is back at 0 where the next arena's begin.
    running = numpy.cumsum(numpy.concatenate((size, -size))[order])
    del order
    # The figure after all changes at one position: the last of each run.
    last = numpy.append(numpy.flatnonzero((numpy.diff(at) != 0) | (numpy.diff(who) != 0)),
                        len(at) - 1) if len(at) else numpy.zeros(0, dtype=numpy.int64)
    keep = last[at[last] < positions]
    at, who, live = at[keep], who[keep], running[keep]
    del running, last, keep
    lo = numpy.searchsorted(who, arenas, side="left")
    hi = numpy.searchsorted(who, arenas, side="right")
    peak = numpy.zeros(len(arenas), dtype=numpy.int64)
    peak_at = numpy.full(len(arenas), -1, dtype=numpy.int64)
    stepped = numpy.flatnonzero(hi > lo)
    if len(stepped):
        peak[stepped] = numpy.maximum.reduceat(live, lo[stepped])
        steps = numpy.arange(len(live), dtype=numpy.int64)
        first = numpy.minimum.reduceat(numpy.where(live == peak[who], steps, len(live)),
                                       lo[stepped])
        peaked = stepped[peak[stepped] > 0]
        peak_at[peaked] = at[first[peak[stepped] > 0]]
    largest, largest_lo, largest_hi = _largest_at_peak(planned, ranges, peak, peak_at, arena,
                                                       block_of_span, most)
    return ArenaSteps(at, live, lo, hi, peak, peak_at, largest, largest_lo, largest_hi)


def _largest_at_peak(planned: PlannedRegions, ranges: ArenaRanges, peak: Array,
                     peak_at: Array, arena: Array, block_of_span: Array,
                     most: int) -> tuple[Array, Array, Array]:
    """Each arena's `most` largest regions (then by offset) live at its peak."""
    when = peak_at[arena]
    live = (peak[arena] > 0) & (planned.span_first <= when) & (planned.span_last >= when)
    blocks = numpy.unique(block_of_span[live])  # ascending: arena by arena
    starts = planned.block_start[blocks]
    owner = numpy.searchsorted(ranges.block_lo, blocks, side="right") - 1
    order = numpy.lexsort((planned.offset[starts], -planned.nbytes[starts], owner))
    blocks, owner = blocks[order], owner[order]
    group = numpy.searchsorted(owner, owner, side="left")
    chosen = numpy.arange(len(blocks)) - group < most
    blocks, owner = blocks[chosen], owner[chosen]
    arenas = numpy.arange(len(ranges.ids), dtype=numpy.int64)
    return (blocks, numpy.searchsorted(owner, arenas, side="left"),
            numpy.searchsorted(owner, arenas, side="right"))

