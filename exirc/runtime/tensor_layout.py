"""Dense tensor layouts: the strides a dim order gives (kernels and the core share it)."""

from __future__ import annotations


def strides(sizes: list[int], dim_order: list[int]) -> list[int]:
    """Element strides of a dense tensor laid out in `dim_order` (outermost first).

    An empty dim_order means the default, contiguous order.
    """
    order = dim_order or list(range(len(sizes)))
    result = [0] * len(sizes)
    step = 1
    for dim in reversed(order):
        result[dim] = step
        step *= max(sizes[dim], 1)
    return result
