"""The ATen operators the runtime runs: an allowlist, not torch's whole registry.

torch's registry has thousands of ATen operators, and many of them trust
their arguments: given what a hostile file can write (an empty `int[4]`, a
class index of 10⁹) they read or write out of bounds and take the process
down. So the runtime resolves an ATen operator from torch's registry only
if it is on this list:

  * the kernel lists of every built-in target (`exirc.targets`: each
    `<target>.yaml` names its kernel sets, `<set>_kernels.txt` lists them;
    portable is ExecuTorch's portable kernel library), which is everything
    exirc's compiler emits and ExecuTorch's portable runtime runs;
  * the few operators below that real programs contain outside those lists.

Kernels registered by name (`exirc.runtime.register_kernel`: the prim ops,
exirc's backend ops, the quantized kernels, users' and plugins' kernels) are
allowed because someone registered them; they do not need this list.
Loading with `allow_any_aten=True` (`exirc run --allow-any-aten-op`) lifts
the list: any ATen operator torch has then runs, trusting the file.
"""

from __future__ import annotations

import functools

from exirc.targets import BACKEND_OPS, builtin_targets, kernel_list, kernel_sets

# Real programs' ATen operators that no target's kernel list names, each with
# why it is as safe to run as the listed ones. None so far: what exirc emits
# outside `to_out_variants` (`sym_size.int`, `copy_`, `select_copy.int_out`,
# `clone.out` in loops and state updates) and what ExecuTorch's emitter adds
# (`_local_scalar_dense`, `sym_numel`) are on ExecuTorch's portable list too.
_OUTSIDE_THE_KERNEL_LISTS: frozenset[str] = frozenset()

# On ExecuTorch's portable list, but torch's CPU kernels trust data the file
# controls: max_pool2d_with_indices_backward writes through its `indices`
# unchecked (the mutation campaign's only remaining segfault). Both are
# training ops no inference program needs; a trusted file can still run them
# with `allow_any_aten`.
_TRUSTING_KERNELS: frozenset[str] = frozenset({
    "aten::max_pool2d_with_indices_backward.grad_input",
    "aten::convolution_backward.out",
})


def is_allowlisted(key: str) -> bool:
    """Whether the ATen operator `key` (`aten::name.overload`, the default
    overload spelled `default`) may be resolved from torch's registry."""
    return key in allowlisted_operators()


@functools.cache
def allowlisted_operators() -> frozenset[str]:
    """Every allowlisted ATen operator, as `aten::name.overload`."""
    names = set(_OUTSIDE_THE_KERNEL_LISTS)
    for target in builtin_targets():
        for kernel_set in kernel_sets(target):
            if kernel_set != BACKEND_OPS:  # exirc's own ops: registered kernels, not ATen
                names |= kernel_list(kernel_set)
    return frozenset(_with_overload(name) for name in names
                     if name.startswith("aten::")) - _TRUSTING_KERNELS


def _with_overload(name: str) -> str:
    """Kernel lists spell a default overload as no overload at all."""
    return name if "." in name.partition("::")[2] else f"{name}.default"
