"""Layouts: the order in which a value's logical dims lie in memory.

A value of the partition (an fx node's tensor, in PyTorch's logical dim
order) may exist in the XNNPACK graph in several physical forms. A layout
`L` says physical axis `i` holds logical dim `L[i]`: `(0, 1, 2, 3)` is
NCHW as PyTorch stores it, `(0, 2, 3, 1)` is NHWC, what XNNPACK's
convolutions and poolings read and write.

Everything here is pure arithmetic on shapes and permutations; the builder
uses it to decide when a value can be reused as is, reshaped (the same
bytes in the same order), or must be transposed.
"""

from __future__ import annotations

from collections.abc import Sequence

Layout = tuple[int, ...]


def identity(rank: int) -> Layout:
    return tuple(range(rank))


def channels_last(rank: int) -> Layout:
    """NHWC for rank 4, NLC for rank 3: the channel dim (1) moved last."""
    if rank < 3:
        return identity(rank)
    return (0, *range(2, rank), 1)


def inverse(layout: Sequence[int]) -> Layout:
    result = [0] * len(layout)
    for position, dim in enumerate(layout):
        result[dim] = position
    return tuple(result)


def physical_shape(shape: Sequence[int], layout: Sequence[int]) -> list[int]:
    """The dims of the value as stored in `layout`."""
    return [int(shape[dim]) for dim in layout]


def axis_of(layout: Sequence[int], dim: int) -> int:
    """The physical axis holding logical dim `dim`."""
    return list(layout).index(dim)


def same_memory(shape: Sequence[int], a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether `a` and `b` store the same bytes in the same order: they may
    differ only in where the size-1 dims sit, so a reshape converts."""
    return ([d for d in a if shape[d] != 1] == [d for d in b if shape[d] != 1])


def transpose_perm(source: Sequence[int], target: Sequence[int]) -> list[int]:
    """The StaticTranspose perm turning a value stored in `source` into `target`.

    Output axis j holds logical dim target[j], found at input axis
    inverse(source)[target[j]].
    """
    where = inverse(source)
    return [where[dim] for dim in target]


def after_permute(layout: Sequence[int], perm: Sequence[int]) -> Layout:
    """The layout of `permute(x, perm)` that shares x's bytes (stored in `layout`).

    Logical dim d of the result is dim perm[d] of x, so the physical axis that
    held x's dim l holds the result's dim inverse(perm)[l]: a permute is a
    relabelling, and costs no node until a consumer needs another order.
    """
    back = inverse(perm)
    return tuple(back[dim] for dim in layout)


def project(layout: Sequence[int], rank: int, small_rank: int) -> Layout:
    """`layout` (of a rank-`rank` value) restricted to its last `small_rank`
    logical dims, renumbered: the layout a broadcast operand of lower rank
    takes to match."""
    offset = rank - small_rank
    return tuple(dim - offset for dim in layout if dim >= offset)


def trailing_compatible(layout: Sequence[int], rank: int, small_rank: int) -> bool:
    """Whether an operand of rank `small_rank` stored in `project(...)`
    broadcasts against a rank-`rank` value stored in `layout` as it does
    logically: XNNPACK aligns trailing *physical* axes, so the last
    `small_rank` physical axes must hold the last `small_rank` logical dims."""
    if small_rank == 0:
        return True
    offset = rank - small_rank
    return all(dim >= offset for dim in layout[rank - small_rank:])


def reshape_layout(in_shape: Sequence[int], out_shape: Sequence[int],
                   layout: Sequence[int]) -> Layout | None:
    """A layout of `reshape(x, out_shape)` with the same bytes as x in `layout`,
    or None when the reshape needs x in another order first.

    A reshape merges and splits runs of logical dims. It keeps the bytes when
    every merged run lies in memory side by side and in logical order; the
    result then stores its dims in the order the runs lie in memory. Size-1
    dims carry no bytes: dropped ones vanish, new ones go just before the
    next larger dim that is placed (so NCL unsqueezed at 2 stays NHWC-like).
    """
    groups = _groups([d for d in range(len(in_shape)) if in_shape[d] != 1],
                     [d for d in range(len(out_shape)) if out_shape[d] != 1],
                     in_shape, out_shape)
    if groups is None:
        return None
    stored = [d for d in layout if in_shape[d] != 1]
    order: list[int] = []
    position = 0
    while position < len(stored):
        group = next((g for g in groups if g[0] and g[0][0] == stored[position]), None)
        if group is None:
            return None
        run = stored[position:position + len(group[0])]
        if run != group[0]:
            return None
        order.extend(group[1])
        position += len(run)
    for dim in range(len(out_shape)):
        if out_shape[dim] == 1:
            later = [i for i, d in enumerate(order) if d > dim]
            order.insert(later[0] if later else len(order), dim)
    return tuple(order)


def _groups(ins: list[int], outs: list[int], in_shape: Sequence[int],
            out_shape: Sequence[int]) -> list[tuple[list[int], list[int]]] | None:
    """Pair minimal runs of non-1 input dims with runs of output dims of equal size."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(ins) and j < len(outs):
        group_in, group_out = [ins[i]], [outs[j]]
        size_in, size_out = int(in_shape[ins[i]]), int(out_shape[outs[j]])
        i, j = i + 1, j + 1
        while size_in != size_out:
            if size_in < size_out and i < len(ins):
                group_in.append(ins[i])
                size_in *= int(in_shape[ins[i]])
                i += 1
            elif size_out < size_in and j < len(outs):
                group_out.append(outs[j])
                size_out *= int(out_shape[outs[j]])
                j += 1
            else:
                return None
        groups.append((group_in, group_out))
    if i != len(ins) or j != len(outs):
        return None
    return groups
