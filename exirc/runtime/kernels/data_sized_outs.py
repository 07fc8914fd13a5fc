"""Guards for ATen kernels whose output size comes from the data.

The load-time meta checks cannot size these outputs, and torch's CPU kernels
allocate the whole result (or a broadcast scratch) before they find that the
planned `out` cannot hold it. A file's `repeats` of 10**9 made
`repeat_interleave` allocate (and touch) every byte the machine had before the
out's resize failed; a `masked_select` of a `[N, 1]` tensor by a `[1, N]` mask
asks for N * N bytes of scratch. Each guard checks the sizes first: a result
the out cannot hold is the program's error (as on ExecuTorch, whose kernels
resize the out within its plan), and scratch the machine cannot give is a
ResourceError, raised before torch asks for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from exirc.errors import ResourceError
from exirc.runtime.machine import available_memory

KernelCall = Callable[..., Any]


def out_capacity(out: torch.Tensor) -> int:
    """Elements `out` can grow to without a new allocation: what its storage holds
    past its offset. Planned tensors' storages are exactly their planned bytes
    and cannot be resized, so this is the plan's capacity."""
    itemsize = out.element_size()
    return max(0, out.untyped_storage().nbytes() // itemsize - int(out.storage_offset()))


def _too_large(what: str, elements: float, out: torch.Tensor) -> RuntimeError:
    return RuntimeError(f"{what} is {elements:.0f} elements, more than the {out_capacity(out)} "
                        f"the program planned for its out")


def _guard_repeat_interleave(call: KernelCall) -> KernelCall:
    def repeat_interleave(repeats: torch.Tensor, *, output_size: int | None = None,
                          out: torch.Tensor) -> Any:
        capacity = out_capacity(out)
        if repeats.dim() == 1 and not repeats.is_floating_point() and repeats.numel():
            if int(repeats.min()) < 0:
                raise RuntimeError("repeats may not be negative")
            # float64: an int64 sum of hostile repeats can wrap to a small number.
            total = float(repeats.to(torch.float64).sum())
            if total > capacity:
                raise _too_large("the sum of repeats", total, out)
        if output_size is not None and output_size > capacity:
            raise _too_large("output_size", output_size, out)
        return call(repeats, output_size=output_size, out=out)
    return repeat_interleave


def _guard_masked_select(call: KernelCall) -> KernelCall:
    def masked_select(self: torch.Tensor, mask: torch.Tensor, *, out: torch.Tensor) -> Any:
        try:
            shape = torch.broadcast_shapes(self.shape, mask.shape)
        except RuntimeError:
            return call(self, mask, out=out)  # torch says what does not broadcast
        elements = math.prod(shape)
        if elements > max(self.numel(), mask.numel()):
            # torch expands both operands into full-size scratch before selecting.
            scratch = elements * (self.element_size() + mask.element_size())
            available = available_memory()
            if available is not None and scratch > available:
                raise ResourceError(
                    f"masked_select broadcasts {list(self.shape)} by {list(mask.shape)} to "
                    f"{list(shape)}: {scratch} bytes of scratch, more than the "
                    f"{available} bytes available now",
                    hint="run the program on a machine with more memory, or check "
                         "the file: its shapes may be corrupted")
        return call(self, mask, out=out)
    return masked_select


GUARDS: dict[str, Callable[[KernelCall], KernelCall]] = {
    "aten::repeat_interleave.Tensor_out": _guard_repeat_interleave,
    "aten::masked_select.out": _guard_masked_select,
}
"""Allowlisted operators whose kernels are wrapped in a size check."""
