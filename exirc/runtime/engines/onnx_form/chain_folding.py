"""Kernels of a fused chain (`onnx_chain`) computed once, at load, by torch itself.

Models compute tables from constants alone inside their forward: T5's
relative-position buckets (arange, sub, abs, log, div, min, where), BLOOM's
ALiBi slopes (pow of a constant by an arange), masks from `full`. ExecuTorch's
files keep those as portable kernels between the delegates, and one with no
ONNX form (`abs`, `pow.Tensor_Tensor`) kept the whole method kernel by kernel.
When every tensor a kernel reads is a constant of the file or a value folded
before it, and it reads no scalar the program changes at run time, the chain
runs its prepared step at load (the same bound call, argument checks
included, that a kernel-by-kernel run makes) and takes its outs as constants:
the same bits the kernels compute every run, whatever their op.

Not folded: kernels outside ATen (quantized, exirc's own, users' kernels),
ops torch tags nondeterministic (rand, dropout, bernoulli: a run draws anew),
`empty` (its contents are whatever the memory held), any op that writes an
argument other than its outs, outs beyond `FOLD_LIMIT_BYTES` (a folded value
is held in the session as well as computed). A step that fails at load fails
the same way every run: the chain is refused with its error, and the kernels,
run one by one, raise it.
"""

from __future__ import annotations

import functools

import torch

from exirc.runtime.kernels.registry import Kernel, torch_op

FOLD_LIMIT_BYTES = 1 << 20
_NONDETERMINISTIC = {torch.Tag.nondeterministic_seeded, torch.Tag.nondeterministic_bitwise}


@functools.cache
def foldable(kernel: Kernel) -> bool:
    """Whether `kernel` computes the same outs from the same arguments every run."""
    if not kernel.name.startswith("aten::") or kernel.name.startswith("aten::empty"):
        return False
    op = torch_op(kernel.name)
    if op is None or _NONDETERMINISTIC & set(op.tags):
        return False
    return all(argument.is_out or argument.alias_info is None or not argument.alias_info.is_write
               for argument in kernel.schema.arguments)
