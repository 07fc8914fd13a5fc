"""Sibling slices as one ONNX Split: an LSTM's gates, attention's q, k and v.

An unrolled LSTM cuts its gate pre-activations into four with four
STATIC_SLICE nodes per step, and attention cuts q, k and v from one
projection; onnxruntime runs each Slice as a node of its own (~1 us each on
small tensors). `plan_splits` finds groups of slices that read the same
value and differ along one axis only (every other dim taken whole), with no
two overlapping, and emits each group as one Split at the first slice's
place: each slice's output is one of the Split's outputs, and the parts of
the axis no slice takes become outputs nobody reads. Split copies exactly
the elements the slices would, so the result is the same, bit for bit.

Slices that do not form such a group (one alone, overlapping ones, ones cut
along two axes, or not plain float32) are emitted one by one as before.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from exirc.runtime.engines.onnx_form.builder import OnnxBuilder, value_name
from exirc.serialize.xnnpack import graph as G

Positioned = list[tuple[int, G.Node]]  # (index in the blob, node), as fuse_clamps gives


@dataclass(frozen=True)
class Split:
    """One group: `source` cut along `axis` into `parts` (offset, size, output id or None)."""

    source: int
    axis: int
    parts: list[tuple[int, int, int | None]]


@dataclass
class SplitPlan:
    """Which node positions start a Split, and which are covered by one."""

    starts: dict[int, Split] = field(default_factory=dict)
    covered: set[int] = field(default_factory=set)

    def emit(self, b: OnnxBuilder, position: int) -> bool:
        """Emit the Split starting at `position`; True if the node there is done with."""
        split = self.starts.get(position)
        if split is not None:
            outputs = [value_name(output) if output is not None else b.fresh("unused")
                       for _, _, output in split.parts]
            b.node("Split", [b.read(split.source),
                            b.ints("split", [size for _, size, _ in split.parts])],
                  outputs, axis=split.axis)
            return True
        return position in self.covered


def _extent(p: G.StaticSlice, dims: list[int]) -> list[tuple[int, int]]:
    """(offset, size) per dim; XNNPACK's size 0 means "to the end"."""
    return [(offset, dim - offset if size == 0 else size)
            for offset, size, dim in zip(p.offsets, p.sizes, dims)]


def _group(b: OnnxBuilder, source: int, members: list[tuple[int, G.StaticSlice]]
           ) -> Split | None:
    dims = list(b.values[source].dims)
    extents = [_extent(p, dims) for _, p in members]
    if any(len(e) != len(dims) for e in extents):
        return None
    cut = {d for e in extents for d, (offset, size) in enumerate(e)
           if (offset, size) != (0, dims[d])}
    if len(cut) != 1:
        return None
    (axis,) = cut
    taken = sorted((e[axis][0], e[axis][1], p.output_id) for e, (_, p) in zip(extents, members))
    parts: list[tuple[int, int, int | None]] = []
    at = 0
    for offset, size, output in taken:
        if offset < at or size <= 0 or offset + size > dims[axis]:
            return None  # overlapping, empty or out of range: leave it to the emitters
        if offset > at:
            parts.append((at, offset - at, None))
        parts.append((offset, size, output))
        at = offset + size
    if at < dims[axis]:
        parts.append((at, dims[axis] - at, None))
    return Split(source, axis, parts)


def plan_splits(b: OnnxBuilder, nodes: Positioned, skip: set[int]) -> SplitPlan:
    """The Splits to emit for `nodes` (positions in `skip` are taken by other fusions)."""
    groups: dict[int, list[tuple[int, G.StaticSlice]]] = defaultdict(list)
    for position, (_, node) in enumerate(nodes):
        p = node.params
        if (node.kind == G.NodeKind.STATIC_SLICE and position not in skip
                and isinstance(p, G.StaticSlice)
                and b.plain_float32(p.input_id) and b.plain_float32(p.output_id)):
            groups[p.input_id].append((position, p))
    plan = SplitPlan()
    for source, members in groups.items():
        if len(members) < 2:
            continue
        split = _group(b, source, members)
        if split is None:
            continue
        first, *rest = (position for position, _ in members)
        plan.starts[first] = split
        plan.covered.update(rest)
    return plan
