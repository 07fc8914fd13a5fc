"""Kernels for exirc's own backend ops (what `--target exirc`'s fusions emit).

The runtime owns these kernels so it runs such programs without importing the
compiler; the compiler's `exirc.backend.ops` binds each op to the pattern it
fuses, for finding and verifying it, and checks its schema against the one
registered here.
"""

from __future__ import annotations

import torch

from exirc.runtime.kernels import register_kernel

ADDMM_RELU_SCHEMA = ("exirc::addmm_relu.out(Tensor self, Tensor mat1, Tensor mat2, *, "
                     "Tensor(a!) out) -> Tensor(a!)")


@register_kernel(ADDMM_RELU_SCHEMA)
def addmm_relu_out(bias: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *,
                   out: torch.Tensor) -> torch.Tensor:
    """relu(bias + mat1 @ mat2) in one pass over `out`."""
    torch.addmm(bias, mat1, mat2, out=out)
    return out.relu_()
