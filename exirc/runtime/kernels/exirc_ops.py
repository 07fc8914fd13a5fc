"""Kernels for exirc's own backend ops (what `--target exirc`'s fusions emit).

The runtime owns these kernels so it runs such programs without importing the
compiler; the compiler's `exirc.backend.ops` binds each op to the pattern it
fuses, for finding and verifying it, with its own copy of the schema (tests
check the two agree). `exirc.runtime.kernels.registry` registers `OWN_KERNELS` in its
default registry as it loads, so the registry always has them; this module
does not import the registry, which would be an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from exirc.runtime.kernels.attention import ATTENTION_KERNELS
from exirc.runtime.kernels.llama import LLAMA_KERNELS
from exirc.runtime.kernels.recurrent import RECURRENT_KERNELS

ADDMM_RELU_SCHEMA = ("exirc::addmm_relu.out(Tensor self, Tensor mat1, Tensor mat2, *, "
                     "Tensor(a!) out) -> Tensor(a!)")


def addmm_relu_out(bias: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *,
                   out: torch.Tensor) -> torch.Tensor:
    """relu(bias + mat1 @ mat2) in one pass over `out`."""
    torch.addmm(bias, mat1, mat2, out=out)
    return out.relu_()


OWN_KERNELS: dict[str, Callable[..., Any]] = {ADDMM_RELU_SCHEMA: addmm_relu_out,
                                              **RECURRENT_KERNELS, **ATTENTION_KERNELS,
                                              **LLAMA_KERNELS}
"""Schema -> kernel, for `exirc.runtime.kernels.registry` to register."""
