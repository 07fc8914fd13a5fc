"""A method's planned tensors and the arena regions they describe, as arrays.

The memory report's data (`memory_report`): a planned tensor is a Tensor value
with `allocation_info`; a region (`Block`) is a distinct (memory_id, offset,
bytes) that one or more values describe. Kept as numpy arrays of machine
ints, sorted by arena, so a file with a million tensors costs arrays, not a
million objects; objects are made only for what a view shows.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy

from exirc.inspector.listing import value_type
from exirc.inspector.value_lifetimes import NONE, Lifetime
from exirc.serialize import program as P

Array = numpy.typing.NDArray[numpy.int64]


@dataclass(frozen=True, slots=True)
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


@dataclass(slots=True)
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


class PlannedRegions:
    """A method's planned tensors and their regions, as arrays.

    Tensors are sorted by (memory_id, offset, bytes, value): an arena is a
    run of them, a region (block) a run within it. `spans` are each region's
    merged live spans, in region order.
    """

    def __init__(self, plan: P.ExecutionPlan, first: Array, last: Array) -> None:
        self.plan = plan
        # Gathered as machine ints (an int object each would cost more than the file).
        indices, ids, offsets, sizes = (array("q") for _ in range(4))
        for index, evalue in enumerate(plan.values):
            if isinstance(evalue, P.Tensor) and evalue.allocation_info is not None:
                indices.append(index)
                ids.append(evalue.allocation_info.memory_id)
                offsets.append(evalue.allocation_info.offset)
                sizes.append(evalue.nbytes)
        value, memory_id, offset, nbytes = (_int64(a) for a in (indices, ids, offsets, sizes))
        del indices, ids, offsets, sizes  # the views keep each until it is replaced
        order = numpy.lexsort((value, nbytes, offset, memory_id))
        self.value = value[order]
        del value
        self.memory_id = memory_id[order]
        del memory_id
        self.offset = offset[order]
        del offset
        self.nbytes = nbytes[order]
        del nbytes, order
        self.first, self.last = first[self.value], last[self.value]
        # Regions: runs of equal (memory_id, offset, bytes).
        count = len(self.value)
        starts = numpy.zeros(count, dtype=bool)
        if count:
            starts[0] = True
        for column in (self.memory_id, self.offset, self.nbytes):
            starts[1:] |= column[1:] != column[:-1]
        self.block_start = numpy.flatnonzero(starts).astype(numpy.int64)
        self.block_end = numpy.append(self.block_start[1:], count).astype(numpy.int64)
        self._spans()

    def _spans(self) -> None:
        """Merge each region's tensor lifetimes into its live spans."""
        span_first, span_last = array("q"), array("q")
        span_start = numpy.zeros(len(self.block_start) + 1, dtype=numpy.int64)
        first, last = self.first.data, self.last.data  # no copies
        for b, (lo, hi) in enumerate(zip(self.block_start.data, self.block_end.data)):
            if hi - lo == 1:  # most regions hold one tensor: nothing to merge
                if first[lo] != NONE:
                    span_first.append(first[lo])
                    span_last.append(last[lo])
            else:
                spans = sorted((first[k], last[k]) for k in range(lo, hi) if first[k] != NONE)
                merged: list[list[int]] = []
                for f, last_ in spans:
                    if merged and f <= merged[-1][1] + 1:
                        merged[-1][1] = max(merged[-1][1], last_)
                    else:
                        merged.append([f, last_])
                for f, last_ in merged:
                    span_first.append(f)
                    span_last.append(last_)
            span_start[b + 1] = len(span_first)
        self.span_first = _int64(span_first)
        self.span_last = _int64(span_last)
        self.span_start = span_start

    def arena_ranges(self) -> ArenaRanges:
        """Where each arena's tensors and regions are in the sorted arrays."""
        ids = self.memory_id
        edges = numpy.flatnonzero(ids[1:] != ids[:-1]) + 1 if len(ids) \
            else numpy.zeros(0, dtype=numpy.int64)
        starts = numpy.concatenate(([0], edges)).astype(numpy.int64) if len(ids) \
            else numpy.zeros(0, dtype=numpy.int64)
        ends = numpy.append(edges, len(ids)).astype(numpy.int64) if len(ids) \
            else numpy.zeros(0, dtype=numpy.int64)
        return ArenaRanges(ids[starts], starts, ends,
                            numpy.searchsorted(self.block_start, starts),
                            numpy.searchsorted(self.block_start, ends))

    def tensor(self, k: int) -> PlannedTensor:
        """Tensor `k` in sorted order."""
        index = int(self.value[k])
        value = self.plan.values[index]
        first = int(self.first[k])
        return PlannedTensor(index, int(self.memory_id[k]), int(self.offset[k]),
                             int(self.nbytes[k]), value_type(value),
                             None if first == NONE else (first, int(self.last[k])))

    def block(self, b: int) -> Block:
        lo, hi = int(self.block_start[b]), int(self.block_end[b])
        s_lo, s_hi = int(self.span_start[b]), int(self.span_start[b + 1])
        return Block(int(self.memory_id[lo]), int(self.offset[lo]), int(self.nbytes[lo]),
                     [self.tensor(k) for k in range(lo, hi)],
                     list(zip(self.span_first[s_lo:s_hi].tolist(),
                              self.span_last[s_lo:s_hi].tolist())))

    def spans_of(self, b: int) -> list[Lifetime]:
        s_lo, s_hi = int(self.span_start[b]), int(self.span_start[b + 1])
        return list(zip(self.span_first[s_lo:s_hi].tolist(), self.span_last[s_lo:s_hi].tolist()))


@dataclass(frozen=True)
class ArenaRanges:
    """For each arena with planned tensors (sorted by id): its first and end
    tensor, and its first and end region, in a `PlannedRegions`'s sorted arrays."""

    ids: Array
    tensor_lo: Array
    tensor_hi: Array
    block_lo: Array
    block_hi: Array

    def __contains__(self, memory_id: object) -> bool:
        return self.get(memory_id) is not None  # type: ignore[arg-type]

    def get(self, memory_id: int) -> tuple[int, int, int, int] | None:
        k = self.index(memory_id)
        if k is None:
            return None
        return (int(self.tensor_lo[k]), int(self.tensor_hi[k]), int(self.block_lo[k]),
                int(self.block_hi[k]))

    def index(self, memory_id: int) -> int | None:
        """Where arena `memory_id` is in these arrays; None if it has no tensors."""
        k = int(numpy.searchsorted(self.ids, memory_id))
        if k == len(self.ids) or self.ids[k] != memory_id:
            return None
        return k


def _int64(values: array[int]) -> Array:
    """An array of machine ints as numpy's (a view: no copy)."""
    return numpy.frombuffer(values, dtype=numpy.int64) if len(values) \
        else numpy.zeros(0, dtype=numpy.int64)
